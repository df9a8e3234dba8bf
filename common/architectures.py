"""The deployed-model architectures of ParM §5.1, each with a dataclass config.

- ``mlp``       two hidden layers of 200 and 100 units with ReLUs (ParM's footnote 2)
- ``lenet5``    LeNet-5: conv(6, 5x5) - pool - conv(16, 5x5) - pool - 120 - 84 - out, ReLU
- ``resnet18``  ResNet-18 (BasicBlock, [2, 2, 2, 2]) adapted to small images: a 3x3
                stride-1 stem and no max-pool, as is usual for CIFAR-sized inputs
                (SERF's small model on 32x32 inputs: threads help one request)
- ``widemlp``   ``depth`` square layers of ``width`` units (default 8 x 4096^2 float32:
                512 MB of weights): one request is a chain of matrix-vector products
                that reads every weight once, so it is memory-bandwidth bound and
                requests running at once interfere (SERF §III-C's large model)

A parity model uses the same architecture and config as its deployed model (§4.3), so
it has the same runtime. Every model takes float32 queries (N, *input_shape) and returns
logits (N, n_classes); the MLP flattens its input itself, so an image-shaped query works
for every architecture.

Weights are initialised as in §5.1: Xavier (uniform) for convolutions, zero biases,
N(0, 0.01) (standard deviation 0.01) for the other weights. BatchNorm keeps its usual
scale 1 and shift 0: drawing a BatchNorm scale from N(0, 0.01) would switch the residual
branches off. ``build(..., init="torch")`` keeps PyTorch's own initialisation instead:
the MLP trains to zero training loss from either, but generalises about 2 points better
on mnist5k from PyTorch's (docs/design/parity_accuracy.md), so both are offered.

Example
-------
>>> net = build("mlp", in_features=64, n_classes=10)              # doctest: +SKIP
>>> net(torch.zeros(5, 1, 8, 8)).shape                            # doctest: +SKIP
torch.Size([5, 10])
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

ARCHS = ("mlp", "lenet5", "resnet18", "widemlp")
INITS = ("parm", "torch")


@dataclass
class MLPConfig:
    in_features: int = 64  # C*H*W of the query
    n_classes: int = 10
    hidden: tuple[int, ...] = (200, 100)


@dataclass
class LeNet5Config:
    in_channels: int = 1
    image_size: int = 28  # square images; 28 is LeNet-5's home size
    n_classes: int = 10


@dataclass
class ResNet18Config:
    in_channels: int = 1
    n_classes: int = 10
    width: int = 64  # channels of the first stage; stages use width * (1, 2, 4, 8)


@dataclass
class WideMLPConfig:
    in_features: int = 3072
    n_classes: int = 10
    width: int = 4096
    depth: int = 8  # square width x width layers after the input layer


class MLP(nn.Module):
    def __init__(self, config: MLPConfig):
        super().__init__()
        sizes = [config.in_features, *config.hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.out = nn.Linear(sizes[-1], config.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.out(x)


class WideMLP(nn.Module):
    def __init__(self, config: WideMLPConfig):
        super().__init__()
        w = config.width
        self.inp = nn.Linear(config.in_features, w)
        self.hidden = nn.ModuleList(nn.Linear(w, w) for _ in range(config.depth))
        self.out = nn.Linear(w, config.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.inp(x.flatten(1)))
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.out(x)


class LeNet5(nn.Module):
    def __init__(self, config: LeNet5Config):
        super().__init__()
        size = config.image_size
        self.conv1 = nn.Conv2d(config.in_channels, 6, 5, padding=2)  # keeps size
        size //= 2
        # A 5x5 valid convolution needs at least 5 pixels; small images (digits, 8x8 ->
        # 4x4 here) get a padded second convolution instead.
        pad2 = 0 if size >= 10 else 2
        self.conv2 = nn.Conv2d(6, 16, 5, padding=pad2)
        size = (size + 2 * pad2 - 4) // 2
        self.fc1 = nn.Linear(16 * size * size, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, config.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, config: ResNet18Config):
        super().__init__()
        w = config.width
        self.stem = nn.Sequential(nn.Conv2d(config.in_channels, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        stages, c_in = [], w
        for i, c_out in enumerate((w, 2 * w, 4 * w, 8 * w)):
            stride = 1 if i == 0 else 2
            stages += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c_in, config.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


REGISTRY: dict[str, tuple[type, type]] = {
    "mlp": (MLPConfig, MLP),
    "lenet5": (LeNet5Config, LeNet5),
    "resnet18": (ResNet18Config, ResNet18),
    "widemlp": (WideMLPConfig, WideMLP),
}


def init_parm_(module: nn.Module) -> nn.Module:
    """Initialise weights in place as in ParM §5.1 and return ``module``."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.xavier_uniform_(m.weight)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
        if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None:
            nn.init.zeros_(m.bias)
    return module


def build(arch: str, *, init: str = "parm", **config) -> nn.Module:
    """Build an architecture by name, initialised as in §5.1.

    Parameters
    ----------
    arch : str
        ``"mlp"``, ``"lenet5"`` or ``"resnet18"``.
    init : str
        ``"parm"`` (§5.1, the default) or ``"torch"`` (PyTorch's own defaults; the MLP
        generalises better from it, see docs/design/parity_accuracy.md).
    **config
        Fields of that architecture's config dataclass (JSON-friendly: lists are fine).

    Returns
    -------
    torch.nn.Module
        Maps float32 (N, *input_shape) to logits (N, n_classes).
    """
    if arch not in REGISTRY:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")
    config_cls, model_cls = REGISTRY[arch]
    if "hidden" in config:
        config["hidden"] = tuple(config["hidden"])
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; known: {', '.join(INITS)}")
    model = model_cls(config_cls(**config))
    return init_parm_(model) if init == "parm" else model


def config_for(arch: str, input_shape: tuple[int, ...] | list[int], n_classes: int, **overrides) -> dict:
    """The JSON-friendly config (as stored in a manifest) of ``arch`` for image queries (C, H, W)."""
    c, h, w = input_shape
    if arch == "mlp":
        config = asdict(MLPConfig(in_features=c * h * w, n_classes=n_classes))
    elif arch == "lenet5":
        if h != w:
            raise ValueError(f"lenet5 wants square images, got {h}x{w}")
        config = asdict(LeNet5Config(in_channels=c, image_size=h, n_classes=n_classes))
    elif arch == "resnet18":
        config = asdict(ResNet18Config(in_channels=c, n_classes=n_classes))
    elif arch == "widemlp":
        config = asdict(WideMLPConfig(in_features=c * h * w, n_classes=n_classes))
    else:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")
    config.update(overrides)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


def query_shape(arch: str, input_shape: tuple[int, ...] | list[int]) -> list[int]:
    """Shape of one query as ``arch`` is served: flat [C*H*W] for the MLP, else [C, H, W]."""
    return [math.prod(input_shape)] if arch in ("mlp", "widemlp") else list(input_shape)
