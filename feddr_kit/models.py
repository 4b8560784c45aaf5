"""Models: a body that computes the penultimate feature ``f(x; θ)`` and a linear head.

``build_model(name, num_classes, head_bias=False)`` returns a :class:`Net`; ``net.features(x)``
gives the raw feature ``[B, feature_dim]`` and ``net(x) = net.head(net.features(x))`` the logits
``[B, C]``. The head has a bias only when asked (the cross-entropy methods, as the reference code).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from .errors import FeddrKitError
from .streams import eval_order  # noqa: F401  (re-exported: where the kit's code found it before streams.py)


class Net(nn.Module):
    """A feature extractor ``body`` followed by a linear ``head`` (weight ``[C, feature_dim]``, bias ``[C]`` or None)."""

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int, batch_stat_norm: bool = False,
                 head_bias: bool = False):
        super().__init__()
        self.body = body
        self.feature_dim = feature_dim
        self.num_classes = num_classes
        # True when BatchNorm uses batch statistics at eval time too (no running stats): predictions
        # then depend on how test batches are composed, so evaluation feeds fixed batches of
        # EVAL_BATCH_SIZE in a fixed, seeded order (see eval_order).
        self.batch_stat_norm = batch_stat_norm
        self.head = nn.Linear(feature_dim, num_classes, bias=head_bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Raw penultimate features ``[B, feature_dim]`` of images ``x`` ``[B, 3, H, W]`` (normalized floats)."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, C]`` = ``head(features(x))``."""
        return self.head(self.features(x))


def _cnn() -> tuple[nn.Module, int]:
    # Two 5x5 conv layers (16, 32 channels) and two fully connected layers, no BatchNorm: about
    # 0.25 M parameters, trains at several thousand images per second on two CPU cores. Max-pooling before the ReLU is the
    # same function as after it (both are monotone) and 4x cheaper. The final ReLU is kept, as in
    # the paper's models, so features are non-negative.
    body = nn.Sequential(
        nn.Conv2d(3, 16, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(32 * 5 * 5, 256), nn.ReLU(inplace=True),
        nn.Linear(256, 128), nn.ReLU(inplace=True),
    )
    return body, 128


def _vgg11() -> tuple[nn.Module, int]:
    # VGG-11 without BatchNorm, then fc 512→512→512 with ReLU (the reference code's CIFAR-10 model).
    layers: list[nn.Module] = []
    channels = 3
    for v in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU(inplace=True)]
            channels = v
    layers += [nn.Flatten(), nn.Linear(512, 512), nn.ReLU(inplace=True), nn.Linear(512, 512), nn.ReLU(inplace=True)]
    body = nn.Sequential(*layers)
    # As the reference: only the convolutions are re-initialised, He-normal with fan-out
    # N(0, 2/(k·k·out_channels)) and zero bias; the linear layers keep PyTorch's default init.
    for m in body.modules():
        if isinstance(m, nn.Conv2d):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            with torch.no_grad():
                m.weight.normal_(0.0, math.sqrt(2.0 / fan_out))
                m.bias.zero_()
    return body, 512


class GlobalAvgPool(nn.Module):
    """Mean over the spatial dimensions: ``[B, C, H, W]`` → ``[B, C]``.

    Same function as ``AdaptiveAvgPool2d(1)`` + ``Flatten``, whose CUDA backward has no deterministic
    kernel (it raises under ``torch.use_deterministic_algorithms``); a mean's backward is deterministic.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def _bn(channels: int) -> nn.BatchNorm2d:
    # No running statistics: batch statistics at train AND eval, nothing to aggregate (as the reference code).
    return nn.BatchNorm2d(channels, track_running_stats=False)


def _mobilenet() -> tuple[nn.Module, int]:
    # MobileNet v1, CIFAR variant (stride-1 stem, 32x32 inputs), d = 1024 (the reference code's CIFAR-100 model).
    cfg = [64, (128, 2), 128, (256, 2), 256, (512, 2), 512, 512, 512, 512, 512, (1024, 2), 1024]
    layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, padding=1, bias=False), _bn(32), nn.ReLU(inplace=True)]
    channels = 32
    for item in cfg:
        out, stride = (item, 1) if isinstance(item, int) else item
        layers += [
            nn.Conv2d(channels, channels, 3, stride=stride, padding=1, groups=channels, bias=False),
            _bn(channels), nn.ReLU(inplace=True),
            nn.Conv2d(channels, out, 1, bias=False), _bn(out), nn.ReLU(inplace=True),
        ]
        channels = out
    layers.append(GlobalAvgPool())
    return nn.Sequential(*layers), 1024


class SpaceToDepth(nn.Module):
    """``[B, C, H, W]`` → ``[B, 4C, H/2, W/2]``: each 2×2 block of pixels becomes one position with its
    four pixels as channels. Nothing is lost (it is a permutation of the input's values), unlike a
    stride or a pooling, and every later layer runs on a quarter of the positions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.pixel_unshuffle(x, 2)


def conv_bn_stages(in_channels: int, widths: tuple[int, ...], pool_first: bool = False) -> list[nn.Module]:
    """Stages of 3×3 convolution (no bias), BatchNorm on batch statistics, ReLU and 2×2 max-pooling, one
    stage per width in ``widths``; each halves the side and sets the channels. ``pool_first`` pools right
    after the convolution (conv, pool, BN, ReLU, as airbench's blocks), so BatchNorm and ReLU run on a
    quarter of the positions."""
    layers: list[nn.Module] = []
    for out in widths:
        conv = nn.Conv2d(in_channels, out, 3, padding=1, bias=False)
        if pool_first:
            layers += [conv, nn.MaxPool2d(2), _bn(out), nn.ReLU(inplace=True)]
        else:
            layers += [conv, _bn(out), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        in_channels = out
    return layers


CNN_BN_WIDTHS = (48, 96, 192)


def _cnn_bn() -> tuple[nn.Module, int]:
    # The teaching model, chosen by measurement (docs/teaching_scale.md): a space-to-depth stem (32x32x3
    # to 16x16x12, lossless), three conv-pool-BN-ReLU stages and a global average, d = 192, about 0.21 M
    # parameters. BatchNorm uses batch statistics at train and eval, as the paper's MobileNet, which
    # puts FedDr+'s FD:DR gradient ratio near MobileNet's; the stem and the early pooling keep a CPU
    # step at a quarter of the positions.
    return (nn.Sequential(SpaceToDepth(), *conv_bn_stages(12, CNN_BN_WIDTHS, pool_first=True), GlobalAvgPool()),
            CNN_BN_WIDTHS[-1])


def _cnn_nobn() -> tuple[nn.Module, int]:
    # cnn_bn with its BatchNorm layers removed, for asking what BatchNorm does to a method: the same stem,
    # widths, pooling and global average, d = 192. Each convolution takes the bias that BatchNorm's shift
    # provided, and the convolutions are initialised as the paper's BatchNorm-free VGG-11 (He-normal with
    # fan-out, zero bias): without a normalization, PyTorch's default init would shrink the signal at
    # every stage. Predictions no longer depend on how a batch is composed.
    layers: list[nn.Module] = [SpaceToDepth()]
    channels = 12
    for out in CNN_BN_WIDTHS:
        conv = nn.Conv2d(channels, out, 3, padding=1)
        with torch.no_grad():
            conv.weight.normal_(0.0, math.sqrt(2.0 / (9 * out)))
            conv.bias.zero_()
        layers += [conv, nn.MaxPool2d(2), nn.ReLU(inplace=True)]
        channels = out
    return nn.Sequential(*layers, GlobalAvgPool()), CNN_BN_WIDTHS[-1]


_BUILDERS: dict[str, Callable[[], tuple[nn.Module, int]]] = {
    "cnn_bn": _cnn_bn, "cnn_nobn": _cnn_nobn, "cnn": _cnn, "vgg11": _vgg11, "mobilenet": _mobilenet}
MODELS = tuple(_BUILDERS)
# Image sides (pixels) each model takes: (smallest, largest or None). cnn: two 5x5 convs and 2x2 pools
# must leave the 5x5 maps its first linear layer expects (32-35); vgg11: five 2x2 pools must leave
# the 1x1 map of its linear layers (32-63); mobilenet: four stride-2 stages must leave more than one
# value per channel for BatchNorm's batch statistics on a one-image batch (>= 17), then pools globally;
# cnn_bn: the stem and three pools come before its last BatchNorm, which needs more than one value per
# channel on a one-image batch, so a 2x2 map (>= 32; even sides for the stem); cnn_nobn has no batch
# statistics, so its stem and three pools need only leave one pixel (>= 16).
IMAGE_SIZES: dict[str, tuple[int, int | None]] = {"cnn_bn": (32, None), "cnn_nobn": (16, None), "cnn": (32, 35),
                                                  "vgg11": (32, 63), "mobilenet": (17, None)}
# Models whose sides must be a multiple of a number (the space-to-depth stem takes 2x2 blocks).
SIDE_MULTIPLES: dict[str, int] = {"cnn_bn": 2, "cnn_nobn": 2}


def register(name: str, builder: Callable[[], tuple[nn.Module, int]], image_sizes: tuple[int, int | None],
             side_multiple: int = 1) -> None:
    """Add a model that ``Config(model=name)`` and :func:`build_model` then accept.

    ``builder()`` returns ``(body, feature_dim)``: a module mapping images ``[B, 3, H, W]`` to features
    ``[B, feature_dim]``, its parameters drawn from torch's global RNG. ``image_sizes`` is the
    ``(smallest, largest or None)`` side it takes, and ``side_multiple`` a number every side must be a
    multiple of (2 for a space-to-depth stem). A BatchNorm without running statistics anywhere in
    the body makes the model a batch-statistics one (evaluated in fixed batches). Registration lasts
    for the process (a Flower SuperNode or a papermill kernel must register it too).
    """
    global MODELS
    if not isinstance(name, str) or not name or name in _BUILDERS:
        raise FeddrKitError(f"register: the model name must be a new non-empty string, got {name!r}"
                            + (f" (already one of {', '.join(MODELS)})" if name in _BUILDERS else ""))
    if not callable(builder):
        raise FeddrKitError(f"register: builder must be a function returning (body, feature_dim), got {builder!r}")
    _BUILDERS[name] = builder
    IMAGE_SIZES[name] = image_sizes
    if side_multiple > 1:
        SIDE_MULTIPLES[name] = side_multiple
    MODELS = tuple(_BUILDERS)


def check_image_size(name: str, image_size: int | tuple[int, int]) -> None:
    """Raise :class:`FeddrKitError` unless model ``name`` takes images of ``image_size`` (side, or ``(H, W)``)."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    low, high = IMAGE_SIZES[name]
    if not all(low <= side and (high is None or side <= high) for side in (h, w)):
        takes = f"{low}x{low} up to {high}x{high}" if high is not None else f"at least {low}x{low}"
        raise FeddrKitError(f"model {name!r} takes images of {takes} pixels, but these are {h}x{w}; "
                            f"resize the images or pick another model")
    multiple = SIDE_MULTIPLES.get(name, 1)
    if h % multiple or w % multiple:
        raise FeddrKitError(f"model {name!r} takes images whose sides are multiples of {multiple} pixels, but these are "
                            f"{h}x{w}; resize the images or pick another model")


def build_model(name: str, num_classes: int, head_bias: bool = False,
                image_size: int | tuple[int, int] | None = None) -> Net:
    """Build a model by name: ``"cnn_bn"`` (the teaching model, BatchNorm, d=192), ``"cnn_nobn"`` (the same
    without BatchNorm, d=192), ``"cnn"`` (the earlier small model, no normalization, d=128), ``"vgg11"`` (d=512)
    or ``"mobilenet"`` (d=1024), or one added by :func:`register`.

    The head is PyTorch's default-initialized ``nn.Linear(d, num_classes, bias=head_bias)``;
    algorithms replace or freeze it (each says whether it wants a bias: ``Algorithm.head_bias``).
    Parameters are drawn from torch's global RNG (seed it first). With ``image_size`` (a side, or
    ``(H, W)``), images the model cannot take are refused (see :data:`IMAGE_SIZES`).
    """
    if name not in _BUILDERS:
        raise FeddrKitError(f"model must be one of {', '.join(MODELS)}, got {name!r}")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise FeddrKitError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if not isinstance(head_bias, bool):
        raise FeddrKitError(f"head_bias must be True or False, got {head_bias!r}")
    if image_size is not None:
        check_image_size(name, image_size)
    body, dim = _BUILDERS[name]()
    batch_stat = any(isinstance(m, nn.BatchNorm2d) and not m.track_running_stats for m in body.modules())
    return Net(body, dim, num_classes, batch_stat_norm=batch_stat, head_bias=head_bias)


# --------------------------------------------------------------------------- evaluation batches
EVAL_BATCH_SIZE = 100  # the reference code's test batch; fixed, as batch statistics depend on it
