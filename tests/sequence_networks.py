"""Small networks of variable-length rows for the tests (importable by name, as the Spark workers rebuild them)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence


class MeanPooledIds(nn.Module):
    """Token ids -> embedding -> masked mean -> linear: a padded network."""

    input_kind = "padded"

    def __init__(self, vocab: int = 50, dim: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).float()
        return self.head((self.embed(ids) * m).sum(1) / m.sum(1))


class MeanPooledSteps(nn.Module):
    """Float steps (B, T, F) -> linear -> masked mean: a padded network of steps x features."""

    def __init__(self, features: int = 4, classes: int = 2) -> None:
        super().__init__()
        self.proj = nn.Linear(features, classes)

    def forward(self, steps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).float()
        return (self.proj(steps) * m).sum(1) / m.sum(1)


class LSTMIds(nn.Module):
    """Token ids packed -> embedding -> LSTM -> last hidden state -> linear: a packed network."""

    input_kind = "packed"

    def __init__(self, vocab: int = 50, dim: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.embed, self.lstm, self.head = (nn.Embedding(vocab, dim), nn.LSTM(dim, dim, batch_first=True),
                                            nn.Linear(dim, classes))

    def forward(self, packed: PackedSequence) -> torch.Tensor:
        embedded = PackedSequence(self.embed(packed.data), packed.batch_sizes, packed.sorted_indices,
                                  packed.unsorted_indices)
        _, (h, _) = self.lstm(embedded)
        return self.head(h[-1])


class PerStep(nn.Module):
    """Token ids -> one output per step (B, T, C): refused by the variable-length stages."""

    def __init__(self, vocab: int = 50, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * mask.unsqueeze(-1)


def unpadded(module: nn.Module, row: torch.Tensor) -> torch.Tensor:
    """The network applied to one row alone, with no padding (the reference of the tests)."""
    one = row.unsqueeze(0)
    if getattr(module, "input_kind", "padded") == "packed":
        from torch.nn.utils.rnn import pack_padded_sequence

        return module(pack_padded_sequence(one, torch.tensor([len(row)]), batch_first=True))[0]
    return module(one, torch.ones(one.shape[:2], dtype=torch.int64))[0]


class MeanOfIds(nn.Module):
    """The masked mean of the ids as numbers -> linear: defined for any integer (generated inputs)."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.head = nn.Linear(1, classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.float()
        mean = (ids.float() * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)
        return self.head(torch.tanh(mean / 100))
