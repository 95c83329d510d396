"""A worker's training and validation rows behind one interface, whatever their kind.

The loop reads rows through :class:`Rows` only, and asks for batches by a :class:`BatchPlan`. Three kinds
implement it (the two made a batch at a time share :class:`BatchedRows`):

* :class:`TensorRows`: rows of one length held in memory as tensors on the run's device (a dense
  :class:`~irbis.train.worker_data.Shard`), batched by :func:`~irbis.train.worker_data.epoch_batches`;
* :class:`~irbis.train.stream.StreamRows`: rows read back from a worker's spill file (images, data past
  the shuffle buffer, token ids past it);
* :class:`~irbis.train.ragged.RaggedRows`: variable-length rows held in memory, in length batches.

:func:`worker_rows` makes a worker's two sets of rows from its shard.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from irbis.kernels.sequences import PadStats
from irbis.train.worker_data import (
    Augment,
    BatchRounds,
    Shard,
    batch_rng,
    epoch_batches,
    iterate,
    prefetched,
)

#: Batches of a sample: ``batches(lo, hi, size)`` gives its rows ``lo..hi-1``, ``size`` at a time.
SampleBatches = Callable[[int, int, int], Iterator[tuple[Any, torch.Tensor]]]

#: A training stream of ``(xb, yb)`` batches; closing it stops the thread that makes them ahead.
Batches = Generator[tuple[Any, torch.Tensor], None, None]


@dataclass(frozen=True)
class BatchPlan:
    """Which of a worker's batches to make, and how: ``steps`` batches a round of ``batch_size`` rows (rows cut
    by length: at most), of ``epoch``'s order drawn from ``seed`` and ``rank``, on ``device`` with labels of
    ``label_dtype``; from batch ``start`` on, for ``rounds`` rounds (the rounds past the first drawn afresh,
    for workers that run free, see :class:`~irbis.train.worker_data.BatchRounds`); each batch passed through
    ``augment`` drawing from :meth:`rng`, and, for rows held as tensors, made on a thread when ``prefetch``;
    image rows read back from a spill decoded in ``feed_processes`` worker processes (0: the task's threads)."""

    batch_size: int
    steps: int
    seed: int
    rank: int
    epoch: int
    device: str = "cpu"
    label_dtype: Any = np.int64
    start: int = 0
    rounds: int = 1
    augment: Augment | None = None
    prefetch: bool = False
    feed_processes: int = 0

    def rng(self, batch: int) -> np.random.Generator:
        """The generator ``augment`` draws from for ``batch``: :func:`~irbis.train.worker_data.batch_rng` of its
        place."""
        return batch_rng(self.seed, self.rank, self.epoch, batch)


@runtime_checkable
class Rows(Protocol):
    """What the training loop asks of a worker's rows. A batch is ``(xb, yb)``: the network's input (a
    tensor, or a variable-length batch, see :mod:`irbis.train.ragged`) and the labels as a tensor."""

    #: Padded and real tokens of the batches made since it was last reset (None: rows of one length).
    stats: PadStats | None

    def __len__(self) -> int: ...

    def labels(self) -> np.ndarray:
        """One label per row."""

    def step_count(self, batch_size: int, seed: int, rank: int, epochs: int) -> int:
        """Batches one pass over the rows takes at ``batch_size`` (length batches: the most of any epoch)."""

    def train_batches(self, plan: BatchPlan) -> Batches:
        """The batches of ``plan`` (:class:`BatchPlan`), augmented (the input format's
        augmentation, then ``plan.augment``). Closing it stops any thread."""

    def norm_inputs(self, plan: BatchPlan) -> Iterator[Any]:
        """The inputs of the first ``plan.steps`` batches training draws in its epoch, unaugmented (BatchNorm's
        statistics)."""

    def eval_batches(self, batch_size: int, device: str, label_dtype: Any) -> Iterator[tuple[Any, torch.Tensor]]:
        """Every row once, unshuffled and unaugmented (evaluation): rows in memory as one batch, rows read
        back or cut by length ``batch_size`` at a time."""

    def row_bytes(self) -> int:
        """Bytes of one row held in memory; 0 where rows are read back a batch at a time."""

    def sample(self, positions: np.ndarray, device: str, label_dtype: Any) -> SampleBatches:
        """The rows at ``positions`` (of these rows, ascending) as a sample read in batches."""

    def nonfinite_rows(self) -> int:
        """Rows with a non-finite feature or label (0 where they were checked or skipped before training)."""


class TensorRows:
    """Rows of one length in memory: features ``x`` ``(n, *row shape)`` and labels ``y`` ``(n,)``, tensors on
    the run's device. An epoch's batches are :class:`~irbis.train.worker_data.BatchRounds` (round 0:
    :func:`~irbis.train.worker_data.epoch_batches`), augmented by :func:`~irbis.train.worker_data.iterate`."""

    stats: PadStats | None = None

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    @classmethod
    def of(cls, shard: Shard, input_shape: list[int] | None, label_dtype: Any, device: str) -> TensorRows:
        """A dense shard's rows as tensors on ``device``, each row viewed as ``input_shape`` when given."""
        # np.require copies only what is read-only (Arrow-backed) or not C-contiguous
        x = torch.from_numpy(np.require(shard.x, np.float32, ["C", "W"]))
        if input_shape:
            x = x.view(len(shard), *input_shape)
        return cls(x.to(device), torch.from_numpy(np.require(shard.y, label_dtype, ["C", "W"])).to(device))

    def __len__(self) -> int:
        return len(self.y)

    def labels(self) -> np.ndarray:
        return self.y.cpu().numpy()

    def step_count(self, batch_size: int, seed: int, rank: int, epochs: int) -> int:
        return -(-len(self) // batch_size)

    def train_batches(self, plan: BatchPlan) -> Batches:
        batches = BatchRounds(len(self), plan.batch_size, plan.steps, plan.seed, plan.rank, plan.epoch, plan.rounds)
        return iterate(self.x, self.y, batches, plan.augment, plan.rng, plan.prefetch, plan.start)

    def norm_inputs(self, plan: BatchPlan) -> Iterator[torch.Tensor]:
        return iter([self.x[torch.from_numpy(ids).to(self.x.device)]
                     for ids in epoch_batches(len(self), plan.batch_size, plan.steps, plan.seed, plan.rank,
                                              plan.epoch)])

    def eval_batches(self, batch_size: int, device: str,
                     label_dtype: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter([(self.x, self.y)] if len(self) else [])

    def row_bytes(self) -> int:
        return self.x[0].numel() * self.x.element_size() if len(self.x) else 4

    def sample(self, positions: np.ndarray, device: str, label_dtype: Any) -> SampleBatches:
        ids = torch.from_numpy(positions).to(self.x.device)
        x, y = self.x[ids], self.y[ids]
        return lambda lo, hi, b: ((x[s:min(s + b, hi)], y[s:min(s + b, hi)]) for s in range(lo, hi, b))

    def nonfinite_rows(self) -> int:
        x, y = self.x, self.y
        finite = torch.isfinite(x.reshape(len(x), -1)).all(1) & torch.isfinite(y.double().reshape(len(y), -1)).all(1)
        return int((~finite).sum())


class BatchedRows:
    """The part of :class:`Rows` that rows made a batch at a time share (rows read back
    from a spill, variable-length rows): a subclass gives ``batches(plan, augment, hook)``, the plan's batches
    (:class:`BatchPlan`: ``start..steps * rounds - 1`` of its epoch; augmented by the input format when
    ``augment``, then passed through ``hook(xb, i)``), and ``in_order(batch_size, device, label_dtype)``."""

    def batches(self, plan: BatchPlan, augment: bool = True,
                hook: Callable[[Any, int], Any] | None = None) -> Iterator[tuple[Any, torch.Tensor]]:
        raise NotImplementedError

    def in_order(self, batch_size: int, device: str, label_dtype: Any) -> Iterator[tuple[Any, torch.Tensor]]:
        raise NotImplementedError

    def train_batches(self, plan: BatchPlan) -> Batches:
        """:meth:`batches` of ``plan``, augmented, then ``plan.augment``; made on a thread while the step runs
        (always: ``plan.prefetch`` is for rows held as tensors)."""
        augment = plan.augment
        hook = None if augment is None else (lambda xb, i: augment(xb, plan.rng(i)))
        return prefetched(self.batches(plan, augment=True, hook=hook))

    def norm_inputs(self, plan: BatchPlan) -> Iterator[Any]:
        """The inputs of the first ``plan.steps`` batches of its epoch (see :meth:`batches`), unaugmented."""
        return (xb for xb, _ in self.batches(replace(plan, start=0, rounds=1), augment=False))

    def eval_batches(self, batch_size: int, device: str, label_dtype: Any) -> Iterator[tuple[Any, torch.Tensor]]:
        """Every row once: :meth:`in_order`."""
        return self.in_order(batch_size, device, label_dtype)

    def row_bytes(self) -> int:
        """0: no row is held at a fixed size (rows are read back, or padded, a batch at a time)."""
        return 0


__all__ = ["BatchPlan", "BatchedRows", "Rows", "SampleBatches", "TensorRows"]
