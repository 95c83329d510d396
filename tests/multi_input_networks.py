"""A small network of two inputs for the tests (importable by name, as the Spark workers rebuild it)."""

from __future__ import annotations

import torch
from torch import nn


class TwoInputs(nn.Module):
    """``forward(a, b)``: each input through its own layer, summed, then a hidden layer and the head."""

    def __init__(self, a: int = 5, b: int = 3, hidden: int = 32, out: int = 3) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(a, hidden), nn.Linear(b, hidden)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.head(self.a(a) + self.b(b))


def two_inputs() -> nn.Module:
    """The factory the estimator's ``network`` names."""
    return TwoInputs()


class PatchAndMeta(nn.Module):
    """``forward(patch (B, 1, 4, 4), meta (B, 3))``: a layer over the patch's rows beside one over the meta; a
    patch of another shape is refused."""

    def __init__(self, hidden: int = 16, out: int = 3) -> None:
        super().__init__()
        self.rows = nn.Linear(4, 4)
        self.patch = nn.Linear(16, hidden)
        self.side = nn.Linear(3, hidden)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, patch: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        if tuple(patch.shape[1:]) != (1, 4, 4) or tuple(meta.shape[1:]) != (3,):
            raise ValueError(f"PatchAndMeta takes (B, 1, 4, 4) and (B, 3), found {tuple(patch.shape)}, "
                             f"{tuple(meta.shape)}")
        return self.head(self.patch(torch.relu(self.rows(patch[:, 0])).flatten(1)) + self.side(meta))


def patch_and_meta() -> nn.Module:
    """The factory the estimator's ``network`` names."""
    return PatchAndMeta()
