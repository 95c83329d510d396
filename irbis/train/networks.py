"""How a training job names its network, and how a worker builds it.

A network is given as

* an architecture name + JSON options, built by ``irbis.models.build_model``
  when that registry knows the name, else by :data:`LOCAL_ARCHITECTURES`;
* a TorchScript file path (``.pt``/``.ts``), loaded with ``torch.jit.load``;
* in the Python API, a picklable zero-argument factory returning an ``nn.Module``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def mlp(in_features: int, hidden: int | list[int] = 128, out_features: int = 10) -> nn.Module:
    """A ReLU multilayer perceptron ``in -> hidden... -> out``."""
    sizes = [in_features, *([hidden] if isinstance(hidden, int) else hidden), out_features]
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def small_cnn(in_channels: int = 3, num_classes: int = 10, width: int = 32) -> nn.Module:
    """A compute-bound CNN for 32x32 images: 3 conv blocks, global pool, linear head."""
    w = width
    return nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * w, 4 * w, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(4 * w, num_classes))


LOCAL_ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {"mlp": mlp, "small_cnn": small_cnn}


def _registry_builder(name: str) -> Callable[..., nn.Module] | None:
    try:
        from irbis import models
    except ImportError:
        return None
    registry = getattr(models, "ARCHITECTURES", {})
    build = getattr(models, "build_model", None)
    if build is not None and name in registry:
        return lambda **kw: build(name, **kw)
    return None


def architecture_names() -> list[str]:
    """Every architecture name a job may use."""
    try:
        from irbis.models import ARCHITECTURES  # type: ignore[attr-defined]
        names = set(ARCHITECTURES)
    except ImportError:
        names = set()
    return sorted(names | set(LOCAL_ARCHITECTURES))


def network_spec(network: str | Callable[[], nn.Module], options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Normalise the user's network argument into a picklable spec."""
    if callable(network) and not isinstance(network, str):
        return {"kind": "factory", "factory": network}
    if not isinstance(network, str) or not network:
        raise TypeError(f"network must be an architecture name, a TorchScript path or a module factory, "
                        f"found {network!r}")
    if network.endswith((".pt", ".pth", ".ts", ".torchscript")):
        return {"kind": "torchscript", "path": network}
    if network not in architecture_names():
        raise ValueError(f"network must be one of {architecture_names()} or a TorchScript file, found {network!r}")
    return {"kind": "architecture", "name": network, "options": dict(options or {})}


def build_network(spec: dict[str, Any]) -> nn.Module:
    """Build the module a spec describes (on every worker, and on the driver)."""
    kind = spec["kind"]
    if kind == "factory":
        module = spec["factory"]()
        if not isinstance(module, nn.Module):
            raise TypeError(f"the network factory must return a torch.nn.Module, found {type(module).__name__}")
        return module
    if kind == "torchscript":
        return torch.jit.load(spec["path"], map_location="cpu")
    build = _registry_builder(spec["name"]) or LOCAL_ARCHITECTURES[spec["name"]]
    try:
        return build(**spec["options"])
    except TypeError as err:
        raise ValueError(f"bad networkOptions for {spec['name']!r}: {err}") from None
