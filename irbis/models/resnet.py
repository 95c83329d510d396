"""ResNet-18 and ResNet-50 (He et al., 2016, "Deep Residual Learning for Image Recognition").

Module names and shapes follow the torchvision layout (``conv1``, ``bn1``, ``layer1.0.conv1`` ...
``fc``), so state dicts saved from ``torchvision.models.resnet18/50`` load with ``strict=True``; the
downsampling stride sits in the 3x3 convolution of the bottleneck ("ResNet v1.5"), as in torchvision.
No weights ship with Irbis: users supply their own state dict. A ``flatten`` module after ``avgpool``
makes the pooled feature vector addressable by name (e.g. for forward hooks).
"""

from __future__ import annotations

import torch
from torch import nn


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = _conv3x3(cin, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(width, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = _downsample(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with an identity or projection shortcut."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = _conv1x1(cin, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, cout)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.downsample(x))


def _downsample(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(_conv1x1(cin, cout, stride), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """ImageNet-style ResNet with the torchvision state-dict layout.

    Parameters
    ----------
    block : type
        ``BasicBlock`` (ResNet-18/34) or ``Bottleneck`` (ResNet-50/101/152).
    layers : tuple of int
        Number of blocks in each of the four stages.
    num_classes : int
        Size of the final linear layer.

    Examples
    --------
    >>> net = resnet18().eval()
    >>> net(torch.zeros(1, 3, 224, 224)).shape
    torch.Size([1, 1000])
    """

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: tuple[int, int, int, int],
                 num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1: nn.Sequential
        self.layer2: nn.Sequential
        self.layer3: nn.Sequential
        self.layer4: nn.Sequential
        cin = 64
        for i, (width, n) in enumerate(zip((64, 128, 256, 512), layers)):
            blocks = []
            for j in range(n):
                blocks.append(block(cin, width, stride=2 if (i > 0 and j == 0) else 1))
                cin = width * block.expansion
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(1)
        self.fc = nn.Linear(cin, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features (the input of ``fc``)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.flatten(self.avgpool(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.forward_features(x))


def resnet18(num_classes: int = 1000) -> ResNet:
    """Build a randomly initialised ResNet-18 (11,689,512 parameters at 1000 classes) in eval mode."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes).eval()


def resnet50(num_classes: int = 1000) -> ResNet:
    """Build a randomly initialised ResNet-50 (25,557,032 parameters at 1000 classes) in eval mode."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes).eval()
