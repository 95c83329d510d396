"""Architectures by name: the code half of the model registry.

``ARCHITECTURES`` maps an architecture name to a factory returning a randomly initialised module in
eval mode. Everything else about a named model (the architecture's ``options``, its input format,
feature layers and weights) is data, in a catalogue entry (:mod:`irbis.models.catalogue`). Training
and persistence refer to a network as ``{"architecture": name, "options": {...}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from irbis.models.efficientnet_lite import efficientnet_lite0
from irbis.models.resnet import resnet18, resnet50
from irbis.models.small import gru_classifier, lenet_digits, lstm_classifier, mlp, small_cnn

ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "efficientnet_lite0": efficientnet_lite0,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mlp": mlp,
    "lenet_digits": lenet_digits,
    "small_cnn": small_cnn,
    "lstm_classifier": lstm_classifier,
    "gru_classifier": gru_classifier,
}


def build_model(architecture: str, **options: Any) -> nn.Module:
    """Build a registered architecture by name, e.g. ``build_model("mlp", in_features=64, hidden=128,
    out_features=10)``. The module is randomly initialised and in eval mode."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}; known: {sorted(ARCHITECTURES)}")
    try:
        return ARCHITECTURES[architecture](**options).eval()
    except TypeError as e:
        raise TypeError(f"architecture {architecture!r} does not accept options {sorted(options)}: {e}") from e


def module_names(architecture: str, **options: Any) -> list[str]:
    """The ``named_modules()`` names of an architecture, found without allocating its weights."""
    with torch.device("meta"):
        return [name for name, _ in build_model(architecture, **options).named_modules() if name]


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
