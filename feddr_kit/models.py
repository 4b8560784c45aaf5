"""Models: a body that computes the penultimate feature ``f(x; θ)`` and a bias-free linear head.

``build_model(name, num_classes)`` returns a :class:`Net`; ``net.features(x)`` gives the raw
feature ``[B, feature_dim]`` and ``net(x) = net.head(net.features(x))`` the logits ``[B, C]``.
"""
from __future__ import annotations

import torch
from torch import nn

from .errors import FeddrKitError


class Net(nn.Module):
    """A feature extractor ``body`` followed by a bias-free linear ``head`` ``[C, feature_dim]``."""

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int, batch_stat_norm: bool = False):
        super().__init__()
        self.body = body
        self.feature_dim = feature_dim
        self.num_classes = num_classes
        # True when BatchNorm uses batch statistics at eval time too (no running stats): predictions
        # then depend on how test batches are composed, so evaluation keeps a fixed batch size.
        self.batch_stat_norm = batch_stat_norm
        self.head = nn.Linear(feature_dim, num_classes, bias=False)

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
    # the paper's models, so features are non-negative (spec §1.7.3).
    body = nn.Sequential(
        nn.Conv2d(3, 16, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(32 * 5 * 5, 256), nn.ReLU(inplace=True),
        nn.Linear(256, 128), nn.ReLU(inplace=True),
    )
    return body, 128


def _vgg11() -> tuple[nn.Module, int]:
    # VGG-11 without BatchNorm, then fc 512→512→512 with ReLU (spec §0, the reference's CIFAR-10 model).
    layers: list[nn.Module] = []
    channels = 3
    for v in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU(inplace=True)]
            channels = v
    layers += [nn.Flatten(), nn.Linear(512, 512), nn.ReLU(inplace=True), nn.Linear(512, 512), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers), 512


class GlobalAvgPool(nn.Module):
    """Mean over the spatial dimensions: ``[B, C, H, W]`` → ``[B, C]``.

    Same function as ``AdaptiveAvgPool2d(1)`` + ``Flatten``, whose CUDA backward has no deterministic
    kernel (it raises under ``torch.use_deterministic_algorithms``); a mean's backward is deterministic.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def _bn(channels: int) -> nn.BatchNorm2d:
    # No running statistics: batch statistics at train AND eval, nothing to aggregate (spec §0).
    return nn.BatchNorm2d(channels, track_running_stats=False)


def _mobilenet() -> tuple[nn.Module, int]:
    # MobileNet v1, CIFAR variant (stride-1 stem, 32x32 inputs), d = 1024 (spec §0).
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


_BUILDERS = {"cnn": _cnn, "vgg11": _vgg11, "mobilenet": _mobilenet}
MODELS = tuple(_BUILDERS)


def build_model(name: str, num_classes: int) -> Net:
    """Build a model by name: ``"cnn"`` (small, CPU-friendly, d=128), ``"vgg11"`` (d=512), ``"mobilenet"`` (d=1024).

    The head is PyTorch's default-initialized ``nn.Linear(d, num_classes, bias=False)``; algorithms
    replace or freeze it. Parameters are drawn from torch's global RNG (seed it first).
    """
    if name not in _BUILDERS:
        raise FeddrKitError(f"model must be one of {', '.join(MODELS)}, got {name!r}")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise FeddrKitError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    body, dim = _BUILDERS[name]()
    return Net(body, dim, num_classes, batch_stat_norm=(name == "mobilenet"))
