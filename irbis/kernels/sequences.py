"""Length-aware batches of variable-length rows: sort by length, cut by a token budget, pad each batch to its own.

A batch of sequences costs what its padded rectangle costs: ``rows x longest row``. Cutting batches in
arrival order pads every short row to the longest of its batch; on real reviews (about 110 tokens on
average, a long tail to 400) that computes about twice the tokens. Here, within one window of rows (an
Arrow batch), the rows are sorted by length, batches are cut so that ``rows x padded length`` stays under
a token budget (and ``rows`` under a cap), each batch is padded to its own longest row rounded up to a
multiple of 8 (which keeps the number of distinct shapes, and of compiled kernels, small), and the
outputs are put back in the rows' order. This is the packed-and-padded minibatch of the seeds' toolkit.

Everything here is NumPy: the kernel runs in Spark's Python workers, in pandas and in the HTTP server.

Examples
--------
>>> import numpy as np
>>> plan = length_batches(np.array([3, 30, 5, 4]), token_budget=64, max_rows=8)
>>> [b.tolist() for b in plan]
[[0, 3, 2], [1]]
>>> [padded_length(np.array([3, 30, 5, 4])[b]) for b in plan]
[8, 32]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["INPUT_KINDS", "PadStats", "check_row_output", "input_kind", "length_batches", "pad_rows", "padded_length",
           "run_by_length"]

#: How a network of variable-length rows takes its batch, the values of its module attribute ``input_kind``:
#: ``"padded"`` (the default) calls ``module(x, mask)``, ``"packed"`` ``module(packed_sequence)``.
INPUT_KINDS = ("padded", "packed")


def input_kind(module: Any) -> str:
    """How ``module`` takes variable-length rows: its ``input_kind`` attribute, ``"padded"`` when absent.

    Raises
    ------
    ValueError
        For any other value.
    """
    kind = getattr(module, "input_kind", "padded")
    if kind not in INPUT_KINDS:
        raise ValueError(f"the network's input_kind must be one of {list(INPUT_KINDS)}, found {kind!r}")
    return kind


#: Padded lengths are rounded up to a multiple of this (tensor cores and SIMD widths like it; fewer shapes).
PAD_MULTIPLE = 8


def padded_length(lengths: np.ndarray, multiple: int = PAD_MULTIPLE) -> int:
    """The length a batch of rows of ``lengths`` is padded to: its longest, rounded up to ``multiple``."""
    longest = int(lengths.max()) if len(lengths) else 0
    return max(multiple, -(-longest // multiple) * multiple)


def length_batches(lengths: np.ndarray, *, token_budget: int, max_rows: int,
                   multiple: int = PAD_MULTIPLE, rows: np.ndarray | None = None) -> list[np.ndarray]:
    """Row indices of each batch: rows sorted by length (stable), batches cut greedily so that
    ``rows x padded length <= token_budget`` and ``rows <= max_rows``.

    A row longer than the budget runs alone. Every row is in exactly one batch. With ``rows``, each item
    stands for that many rows (a request of several texts, ``lengths`` its longest) and an item is never
    split: a batch's rows are the sum of its items', and an item over either bound runs alone.
    """
    if token_budget < 1 or max_rows < 1:
        raise ValueError(f"token_budget and max_rows must be >= 1, got {token_budget} and {max_rows}")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    padded = np.maximum(multiple, -(-lengths[order] // multiple) * multiple)
    counts = np.ones(len(order), np.int64) if rows is None else np.asarray(rows, dtype=np.int64)[order]
    total = np.concatenate([[0], np.cumsum(counts)])  # rows of the items before each sorted position
    batches: list[np.ndarray] = []
    start, n = 0, len(order)
    while start < n:
        # sorted ascending, so the batch [start, stop) is padded to padded[stop - 1]
        stop = start + 1
        while (stop < n and total[stop + 1] - total[start] <= max_rows
               and (total[stop + 1] - total[start]) * padded[stop] <= token_budget):
            stop += 1
        batches.append(order[start:stop])
        start = stop
    return batches


def pad_rows(rows: Sequence[np.ndarray], length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (1-d integer arrays, each at most ``length`` long) as one ``(len(rows), length)`` int64 id
    array padded with ``pad_id``, and its int64 attention mask (1 on real tokens).

    Rows of float steps (``(steps, features)`` arrays) give one ``(len(rows), length, features)`` float32
    array padded with ``pad_id`` instead.
    """
    first = rows[0] if len(rows) else np.zeros(0, np.int64)
    if first.dtype.kind == "f" or first.ndim > 1:
        steps = np.full((len(rows), length, *first.shape[1:]), pad_id, dtype=np.float32)
        mask = np.zeros((len(rows), length), dtype=np.int64)
        for i, row in enumerate(rows):
            steps[i, :len(row)] = row
            mask[i, :len(row)] = 1
        return steps, mask
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    return ids, mask


@dataclass
class PadStats:
    """What a run of length-aware batches computed: real tokens, padded tokens, batches."""

    tokens: int = 0
    padded: int = 0
    batches: int = 0

    @property
    def waste(self) -> float:
        """Padded tokens over real tokens (1.0: no padding)."""
        return self.padded / self.tokens if self.tokens else 1.0

    def add(self, other: "PadStats") -> None:
        self.tokens += other.tokens
        self.padded += other.padded
        self.batches += other.batches


def run_by_length(rows: Sequence[np.ndarray], run: Callable[[np.ndarray, np.ndarray], Any], *,
                  token_budget: int, max_rows: int, pad_id: int = 0,
                  multiple: int = PAD_MULTIPLE) -> tuple[Any, PadStats]:
    """``run(ids, mask)`` over length-aware batches of ``rows``; its outputs, one per row, in the rows' order.

    ``run`` returns one output row per input row (``(B, *shape)``), or a dict of such arrays (several
    outputs of one network); the result is ``(len(rows), *shape)`` (or a dict of them). A network's output
    must be per row: :func:`check_row_output` refuses one per step.
    """
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    stats = PadStats()
    out: dict[Any, np.ndarray] | None = None
    single = False
    for batch in length_batches(lengths, token_budget=token_budget, max_rows=max_rows, multiple=multiple):
        length = padded_length(lengths[batch], multiple)
        ids, mask = pad_rows([rows[i] for i in batch], length, pad_id)
        result = run(ids, mask)
        single = not isinstance(result, dict)
        parts = {None: result} if single else result
        if out is None:
            out = {}
        for name, part in parts.items():
            part = np.asarray(part)
            if name not in out:
                out[name] = np.empty((len(rows), *part.shape[1:]), dtype=part.dtype)
            out[name][batch] = part
        stats.add(PadStats(int(lengths[batch].sum()), int(mask.size), 1))
    if out is None:
        return np.empty((0,), dtype=np.float32), stats
    return (out[None] if single else out), stats


def check_row_output(shape: Sequence[int], rows: int, length: int) -> None:
    """Refuse a network output with one value per step (``(B, T, ...)`` for ``B`` rows padded to ``T``)."""
    if len(shape) >= 3 and shape[0] == rows and shape[1] == length:
        raise ValueError(f"the network gives one output per step (shape {list(shape)} for a batch of {rows} rows "
                         f"of {length} padded steps); a variable-length stage takes one output per row: pool "
                         f"the steps inside the network (e.g. the last state or the masked mean)")
