"""Tiny seeded networks for tests, examples and training experiments.

Each builder takes a ``seed`` so that two calls give identical initial weights (what distributed
training strategies compare against), without disturbing the global torch RNG.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import nn

#: torch's global RNG is shared by the threads of a process: workers that build their networks at the
#: same time (the thread backend) must take turns, or one reseeds the RNG in the middle of the other's
#: initialisation and the "seeded" weights depend on timing.
_RNG_LOCK = threading.Lock()


_M = TypeVar("_M", bound=nn.Module)

def _seeded(seed: int, make: Callable[[], _M]) -> _M:
    with _RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make().eval()


def mlp(in_features: int, hidden: int | Sequence[int], out_features: int, seed: int = 0) -> nn.Sequential:
    """Multi-layer perceptron ``in -> hidden... -> out`` with ReLU, flattening its input first.

    Parameters
    ----------
    in_features : int
        Size of the (flattened) input, e.g. 64 for 8x8 digits.
    hidden : int or sequence of int
        Width of each hidden layer; an empty sequence gives a linear model.
    out_features : int
        Number of outputs (classes).
    seed : int
        Seed of the initial weights.

    Examples
    --------
    >>> mlp(64, 128, 10)(torch.zeros(2, 64)).shape
    torch.Size([2, 10])
    """
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    dims = [in_features, *widths, out_features]
    for d in dims:
        if int(d) < 1:
            raise ValueError(f"mlp layer sizes must be positive, found {dims}")

    def make() -> nn.Sequential:
        layers: list[nn.Module] = [nn.Flatten(1)]
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    return _seeded(seed, make)


def lenet_digits(num_classes: int = 10, seed: int = 0) -> nn.Sequential:
    """LeNet-style CNN for 1x8x8 images (scikit-learn digits): two conv+pool stages, two linear layers.

    Module names: ``features`` (B, 32, 2, 2), ``flatten`` (B, 128), ``classifier`` (B, num_classes).
    """

    def make() -> nn.Sequential:
        features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        classifier = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, num_classes))
        return nn.Sequential(OrderedDict(features=features, flatten=nn.Flatten(1), classifier=classifier))

    return _seeded(seed, make)


def small_cnn(num_classes: int = 10, width: int = 32, seed: int = 0) -> nn.Sequential:
    """Small CNN for 3x32x32 images (CIFAR-sized): three conv-BN-ReLU-pool stages and a linear layer.

    Module names: ``features`` (B, 4*width, 4, 4), ``pool`` (B, 4*width, 1, 1), ``flatten``
    (B, 4*width), ``classifier`` (B, num_classes).
    """

    def stage(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.MaxPool2d(2)]

    def make() -> nn.Sequential:
        features = nn.Sequential(*stage(3, width), *stage(width, 2 * width), *stage(2 * width, 4 * width))
        return nn.Sequential(OrderedDict(features=features, pool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten(1),
                                    classifier=nn.Linear(4 * width, num_classes)))

    return _seeded(seed, make)



class LSTMClassifier(nn.Module):
    """Token ids -> embedding -> LSTM -> last hidden state -> linear: a recurrent classifier over
    variable-length rows, taken packed (``input_kind = "packed"``: ``module(packed)``, a
    :class:`torch.nn.utils.rnn.PackedSequence` of ids; the last hidden state is each row's own last step)."""

    input_kind = "packed"

    def __init__(self, vocab_size: int, num_classes: int, embed: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.rnn = nn.LSTM(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, packed: nn.utils.rnn.PackedSequence) -> torch.Tensor:
        embedded = nn.utils.rnn.PackedSequence(self.embed(packed.data), packed.batch_sizes,
                                               packed.sorted_indices, packed.unsorted_indices)
        _, (h, _) = self.rnn(embedded)
        return self.head(h[-1])


class GRUClassifier(nn.Module):
    """Token ids and their mask -> embedding -> GRU -> mean of the real steps' outputs -> linear
    (``input_kind = "padded"``: ``module(ids, mask)``, ids padded with 0 on the right). With ``features``
    (and no ``vocab_size``) the rows are steps of that many float features (a burst's frame features, a
    sensor's readings), ``(B, T, features)``, which the GRU reads as they are."""

    input_kind = "padded"

    def __init__(self, vocab_size: int, num_classes: int, embed: int = 16, hidden: int = 32,
                 features: int = 0) -> None:
        super().__init__()
        if (vocab_size > 0) == (features > 0):
            raise ValueError(f"GRUClassifier takes token ids (vocab_size) or steps of features (features), one "
                             f"of them: found vocab_size={vocab_size}, features={features}")
        self.embed = nn.Embedding(vocab_size, embed, padding_idx=0) if vocab_size else nn.Identity()
        self.rnn = nn.GRU(embed if vocab_size else features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        m = mask.unsqueeze(-1).to(out.dtype)
        return self.head((out * m).sum(1) / m.sum(1).clamp(min=1))


def lstm_classifier(vocab_size: int, num_classes: int = 2, embed: int = 16, hidden: int = 32,
                    seed: int = 0) -> LSTMClassifier:
    """A seeded :class:`LSTMClassifier` (packed input) over token ids below ``vocab_size``."""
    return _seeded(seed, lambda: LSTMClassifier(vocab_size, num_classes, embed, hidden))


def gru_classifier(vocab_size: int = 0, num_classes: int = 2, embed: int = 16, hidden: int = 32,
                   seed: int = 0, features: int = 0) -> GRUClassifier:
    """A seeded :class:`GRUClassifier` (padded rows and mask) over token ids below ``vocab_size``, or over
    steps of ``features`` float features."""
    return _seeded(seed, lambda: GRUClassifier(vocab_size, num_classes, embed, hidden, features))
