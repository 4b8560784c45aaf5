"""Models: a body that computes the penultimate feature ``f(x; θ)`` and a linear head.

``build_model(name, num_classes, head_bias=False)`` returns a :class:`Net`; ``net.features(x)``
gives the raw feature ``[B, feature_dim]`` and ``net(x) = net.head(net.features(x))`` the logits
``[B, C]``. The head has a bias only when asked (the cross-entropy methods, as the reference code).
"""
from __future__ import annotations

import math

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
    def forward(self, x):
        return nn.functional.pixel_unshuffle(x, 2)


def _convnet_bn(widths: tuple[int, ...], s2d: bool = False, pools=None):
    def build() -> tuple[nn.Module, int]:
        layers: list[nn.Module] = [SpaceToDepth()] if s2d else []
        channels = 12 if s2d else 3
        for i, out in enumerate(widths):
            layers += [nn.Conv2d(channels, out, 3, padding=1, bias=False), _bn(out), nn.ReLU(inplace=True)]
            if pools is None or pools[i]:
                layers.append(nn.MaxPool2d(2))
            channels = out
        layers.append(GlobalAvgPool())
        return nn.Sequential(*layers), channels
    return build


_BUILDERS = {"cnn": _cnn, "vgg11": _vgg11, "mobilenet": _mobilenet,
             "bn3s": _convnet_bn((32, 64, 128)), "bn3m": _convnet_bn((64, 128, 256)), "bn4s": _convnet_bn((32, 64, 128, 256)),
             "s2d48": _convnet_bn((48, 96, 192), True), "s2d64": _convnet_bn((64, 128, 256), True), "s2d32": _convnet_bn((32, 64, 128), True),
             "s2d96": _convnet_bn((96, 192, 384), True),
             "s2d48d": _convnet_bn((48, 96, 96, 192), True, (1, 0, 1, 1)), "s2d64n": _convnet_bn((64, 128, 256), True, (1, 1, 0))}
MODELS = tuple(_BUILDERS)
# Image sides (pixels) each model takes: (smallest, largest or None). cnn: two 5x5 convs and 2x2 pools
# must leave the 5x5 maps its first linear layer expects (32-35); vgg11: five 2x2 pools must leave
# the 1x1 map of its linear layers (32-63); mobilenet: four stride-2 stages must leave more than one
# value per channel for BatchNorm's batch statistics on a one-image batch (>= 17), then pools globally.
IMAGE_SIZES: dict[str, tuple[int, int | None]] = {"cnn": (32, 35), "vgg11": (32, 63), "mobilenet": (17, None),
    "bn3s": (8, None), "bn3m": (8, None), "bn4s": (16, None),
    "s2d48": (16, None), "s2d64": (16, None), "s2d32": (16, None), "s2d96": (16, None), "s2d48d": (16, None), "s2d64n": (16, None)}


def check_image_size(name: str, image_size: int | tuple[int, int]) -> None:
    """Raise :class:`FeddrKitError` unless model ``name`` takes images of ``image_size`` (side, or ``(H, W)``)."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    low, high = IMAGE_SIZES[name]
    if not all(low <= side and (high is None or side <= high) for side in (h, w)):
        takes = f"{low}x{low} up to {high}x{high}" if high is not None else f"at least {low}x{low}"
        raise FeddrKitError(f"model {name!r} takes images of {takes} pixels, but these are {h}x{w}; "
                            f"resize the images or pick another model")


def build_model(name: str, num_classes: int, head_bias: bool = False,
                image_size: int | tuple[int, int] | None = None) -> Net:
    """Build a model by name: ``"cnn"`` (small, CPU-friendly, d=128), ``"vgg11"`` (d=512), ``"mobilenet"`` (d=1024).

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
