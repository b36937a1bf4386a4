"""The built-in models, and `module:callable` for the user's own.

Every model takes a batch of samples shaped like the dataset's (C, H, W), or (D,) when flat,
and returns logits over num_classes. Convolutions feeding a BatchNorm carry no bias.
"""

from __future__ import annotations

import importlib
import math

import torch
from torch import nn

from ddp_trainer.errors import TrainerError
from ddp_trainer.options import TrainerOptions


def build_model(options: TrainerOptions, in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if options.model == "mlp":
        return mlp(in_shape, num_classes)
    if options.model in ("wide-resnet", "resnet18") and len(in_shape) != 3:
        raise TrainerError(
            f"--model {options.model} needs image samples (CxHxW); this dataset's are {in_shape}"
        )
    if options.model == "wide-resnet":
        return WideResNet(in_shape[0], num_classes, options.wrn_depth, options.wrn_width)
    if options.model == "resnet18":
        return ResNet18(in_shape[0], num_classes)
    return _user_model(options.model, in_shape, num_classes)


def mlp(in_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """The tutorials' sequential net: flatten, two hidden ReLU layers, logits."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(in_shape), 128),
        nn.ReLU(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class _PreActBlock(nn.Module):
    """Wide-ResNet block: BN-ReLU-conv twice, with a 1x1 projection when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activated = torch.relu(self.bn1(x))
        residual: torch.Tensor = x if self.shortcut is None else self.shortcut(activated)
        hidden = self.conv1(activated)
        out: torch.Tensor = self.conv2(torch.relu(self.bn2(hidden)))
        return out + residual


class WideResNet(nn.Module):
    """WRN-depth-width (Zagoruyko & Komodakis): three groups of (depth-4)/6 blocks."""

    def __init__(self, in_channels: int, num_classes: int, depth: int, width: int) -> None:
        super().__init__()
        blocks_per_group = (depth - 4) // 6
        widths = [16 * width, 32 * width, 64 * width]
        layers: list[nn.Module] = [_conv3x3(in_channels, 16)]
        channels = 16
        for group, out_channels in enumerate(widths):
            for block in range(blocks_per_group):
                stride = 2 if group > 0 and block == 0 else 1
                layers.append(_PreActBlock(channels, out_channels, stride))
                channels = out_channels
        layers += [nn.BatchNorm2d(channels), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits


class _BasicBlock(nn.Module):
    """ResNet basic block: conv-BN-ReLU-conv-BN plus the (projected) input, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv3x3(in_channels, out_channels, stride),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
            _conv3x3(out_channels, out_channels),
            nn.BatchNorm2d(out_channels),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18, CIFAR variant: a 3x3 stride-1 stem and no max-pool, for 32x32 inputs."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv3x3(in_channels, 64), nn.BatchNorm2d(64), nn.ReLU()]
        channels = 64
        for out_channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [
                _BasicBlock(channels, out_channels, stride),
                _BasicBlock(out_channels, out_channels, 1),
            ]
            channels = out_channels
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits


def _user_model(spec: str, in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    module_name, _, attribute = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise TrainerError(
            f"--model {spec}: cannot load {attribute} from {module_name}: {exc}"
        ) from None
    try:
        model = factory(in_shape=in_shape, num_classes=num_classes)
    except TypeError as exc:  # the wrong signature; errors inside the factory keep a traceback
        raise TrainerError(
            f"--model {spec}: calling {attribute}(in_shape={in_shape}, "
            f"num_classes={num_classes}) failed: {exc}"
        ) from None
    if not isinstance(model, nn.Module):
        raise TrainerError(f"--model {spec} returned {type(model).__name__}, not an nn.Module")
    return model
