"""How a training job names its network, and how a worker builds it.

A network is given as

* an architecture name + JSON options, built by ``irbis.models.build_model``;
* a TorchScript file path (``.pt``/``.ts``), loaded with ``torch.jit.load``;
* in the Python API, a picklable zero-argument factory returning an ``nn.Module``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def architecture_names() -> list[str]:
    """Every architecture name a job may use (the keys of ``irbis.models.ARCHITECTURES``)."""
    from irbis.models import ARCHITECTURES

    return sorted(ARCHITECTURES)


class SplitInputs(nn.Module):
    """A network of several inputs run on one flat input row: ``forward(x)`` cuts each row of ``x`` ``(B, n)``
    into the inputs' values, in order, and calls ``module(x1, x2, ...)``, each ``xi`` of shape
    ``(B, *shapes[i])``. Training and the fitted model hold several input columns as one row of their values
    side by side, so every strategy, stream and engine runs them as it runs one column."""

    def __init__(self, module: nn.Module, shapes: list[list[int]]) -> None:
        super().__init__()
        self.module = module
        self.shapes = [list(s) for s in shapes]
        self.widths = [int(torch.tensor(s).prod()) for s in self.shapes]

    def forward(self, x: torch.Tensor) -> Any:
        flat, start, parts = x.flatten(1), 0, []
        for width, shape in zip(self.widths, self.shapes):
            parts.append(flat[:, start:start + width].unflatten(1, shape))
            start += width
        return self.module(*parts)


class Activated(nn.Module):
    """``activation(module(*inputs))``: a network ending in the activation its loss implies (``bce``'s sigmoid:
    per-class probabilities), whatever number of inputs it takes."""

    def __init__(self, module: nn.Module, activation: nn.Module) -> None:
        super().__init__()
        self.module, self.activation = module, activation

    def forward(self, x: Any, *more: Any) -> Any:  # a first input by name: torch.export traces one-input networks
        return self.activation(self.module(x, *more))


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
    """Build the module a spec describes (on every worker, and on the driver); with ``spec["inputs"]`` (the
    row shapes of several input columns) wrapped in :class:`SplitInputs`."""
    if spec.get("inputs"):
        return SplitInputs(build_network({k: v for k, v in spec.items() if k != "inputs"}), spec["inputs"])
    kind = spec["kind"]
    if kind == "factory":
        module = spec["factory"]()
        if not isinstance(module, nn.Module):
            raise TypeError(f"the network factory must return a torch.nn.Module, found {type(module).__name__}")
        return module
    if kind == "torchscript":
        return torch.jit.load(spec["path"], map_location="cpu")
    from irbis.models import build_model

    try:
        return build_model(spec["name"], **spec["options"])
    except TypeError as err:
        raise ValueError(f"bad networkOptions for {spec['name']!r}: {err}") from None
