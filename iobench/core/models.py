"""The models `iobench train` trains, defined here (torchvision is not everywhere), in one table.

| name | dataset | task | notes |
|---|---|---|---|
| `cnn` | cifar10 | classification | small 3-conv CNN; the `auto` default for cifar10 (CPU-friendly) |
| `resnet18` | cifar10 | classification | ResNet-18, CIFAR variant (3x3 stem, no max-pool) |
| `resnet50` | imagenet | classification | ResNet-50 (He et al. 2016, v1.5 strides); `auto` for imagenet |
| `cosmoflow` | cosmoflow | regression (4 outputs) | MLPerf HPC CosmoFlow-style 3D conv/pool stack + FC head |

Every model starts with a batch-norm layer over the input channels, so it
trains whatever scale the loader decodes to (0..1 or 0..255 floats).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from iobench.core.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """One model: which datasets it fits, its task and its default learning rate."""

    name: str
    datasets: tuple[str, ...]
    task: str  # "classification" (cross-entropy, accuracy) or "regression" (MSE)
    default_lr: float  # for SGD with momentum 0.9, at a global batch of `ref_batch` samples
    build: Callable[[int], nn.Module]  # num_outputs -> module
    about: str
    ref_batch: int = 256

    def lr_for(self, global_batch: int) -> float:
        """Default learning rate for `global_batch` samples per step (linear scaling rule)."""
        return self.default_lr * global_batch / self.ref_batch


class SmallCNN(nn.Module):
    """Three conv/ReLU/pool stages and a linear head: ~0.3 M parameters, fast on a CPU."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.BatchNorm2d(in_channels),
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1, bias=False), nn.BatchNorm2d(128), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.flatten(self.features(x), 1))
        return out


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(cin, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # v1.5: stride here
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = _shortcut(cin, out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """ResNet; `cifar_stem` uses a 3x3 stride-1 stem without max-pool (32x32 inputs)."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
                 num_classes: int, cifar_stem: bool) -> None:
        super().__init__()
        if cifar_stem:
            stem = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
        else:
            stem = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                    nn.MaxPool2d(3, 2, 1)]
        self.stem = nn.Sequential(nn.BatchNorm2d(3), *stem)
        cin, stages = 64, []
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            blocks = []
            for j in range(n):
                blocks.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        out: torch.Tensor = self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
        return out


class CosmoFlow(nn.Module):
    """CosmoFlow 3D CNN (after MLPerf HPC): 5 x (Conv3d k3, LeakyReLU, MaxPool3d 2), FC 128-64-N.

    Input [B, 4, 128, 128, 128] (channels first); outputs N = 4 regression targets.
    """

    def __init__(self, num_outputs: int = 4, in_channels: int = 4, base_filters: int = 16,
                 n_conv: int = 5) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.BatchNorm3d(in_channels)]
        cin = in_channels
        for i in range(n_conv):
            cout = base_filters * 2 ** i
            layers += [nn.Conv3d(cin, cout, 3, padding=1), nn.LeakyReLU(0.3, inplace=True),
                       nn.MaxPool3d(2)]
            cin = cout
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool3d(4))
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(cin * 4 ** 3, 128), nn.LeakyReLU(0.3, inplace=True),
            nn.Dropout(0.2), nn.Linear(128, 64), nn.LeakyReLU(0.3, inplace=True),
            nn.Linear(64, num_outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("cnn", ("cifar10",), "classification", 0.05,
                  lambda n: SmallCNN(n), "small 3-conv CNN (~0.1 M parameters)", ref_batch=64),
        ModelSpec("resnet18", ("cifar10",), "classification", 0.05,
                  lambda n: ResNet(BasicBlock, [2, 2, 2, 2], n, cifar_stem=True),
                  "ResNet-18, CIFAR variant (~11 M parameters)", ref_batch=64),
        ModelSpec("resnet50", ("imagenet",), "classification", 0.1,
                  lambda n: ResNet(Bottleneck, [3, 4, 6, 3], n, cifar_stem=False),
                  "ResNet-50 v1.5 (~25.6 M parameters)"),
        ModelSpec("cosmoflow", ("cosmoflow",), "regression", 0.002,
                  lambda n: CosmoFlow(n), "CosmoFlow 3D CNN, 4 regression outputs", ref_batch=8),
    )
}

# dataset -> the model `--model auto` picks
DEFAULT_MODEL: dict[str, str] = {"cifar10": "cnn", "imagenet": "resnet50", "cosmoflow": "cosmoflow"}


def resolve_model(name: str, dataset: str) -> str:
    """The concrete model name for `--model NAME` on `dataset` ("auto" -> the default)."""
    if name == "auto":
        if dataset not in DEFAULT_MODEL:
            raise ConfigError(f"no default model for dataset {dataset!r}; pass --model "
                              f"({', '.join(MODELS)}) or --model none")
        return DEFAULT_MODEL[dataset]
    spec = parse_model(name)
    if dataset not in spec.datasets:
        fits = [m for m, s in MODELS.items() if dataset in s.datasets]
        raise ConfigError(f"model {name!r} is for {', '.join(spec.datasets)}, not {dataset!r}; "
                          f"use --model {' or '.join(fits) or 'none'}")
    return name


def parse_model(name: str) -> ModelSpec:
    """The spec of model `name`, or a ConfigError naming the choices."""
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; choose auto, none, or one of: "
                          f"{', '.join(MODELS)}") from None


def build_model(name: str, num_outputs: int) -> nn.Module:
    """A freshly initialised model; `num_outputs` = classes or regression targets."""
    return parse_model(name).build(num_outputs)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (count)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """`t` in channels-last order where it has one: a 4-D image batch (NHWC) or a 5-D volume
    batch (NDHWC, `channels_last_3d`); other tensors as they are."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    return t if fmt is None else t.contiguous(memory_format=fmt)


def channels_last_model(model: nn.Module) -> nn.Module:
    """`model` with its convolution weights in channels-last order (`--channels-last`):
    `channels_last_3d` for a model of 3-D convolutions (cosmoflow), `channels_last` else."""
    three_d = any(isinstance(m, nn.Conv3d) for m in model.modules())
    fmt = torch.channels_last_3d if three_d else torch.channels_last
    # torch's stub of Module.to lacks the memory_format keyword that it takes
    return model.to(memory_format=fmt)  # type: ignore[call-overload,no-any-return]
