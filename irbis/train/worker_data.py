"""A worker's share of the data: validation split, per-epoch shuffling, batching, prefetch."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Augment = Callable[[np.ndarray, np.random.Generator], np.ndarray]


@dataclass
class Shard:
    """Features ``x`` (n, d) float32 and labels ``y`` (n,), or (n, k) for vector labels, of one worker; or
    ragged rows: ``x`` an object array of 1-d int64 arrays of token ids (see :mod:`irbis.train.ragged`)."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


def finite_rows(labels: np.ndarray) -> np.ndarray:
    """Which rows of labels are finite: a number per row ``(n,)``, or a vector per row ``(n, k)`` (all of it)."""
    labels = np.asarray(labels, np.float64)
    return np.isfinite(labels) if labels.ndim == 1 else np.isfinite(labels).all(axis=1)


def drop_nonfinite(shard: Shard) -> tuple[Shard, int]:
    """The shard without rows whose features or label are NaN or infinite, and how many were dropped."""
    keep = np.isfinite(shard.x).all(axis=1) & finite_rows(shard.y)
    dropped = int(len(keep) - keep.sum())
    return (shard, 0) if not dropped else (Shard(shard.x[keep], shard.y[keep]), dropped)


def split_validation(shard: Shard, fraction: float, seed: int) -> tuple[Shard, Shard]:
    """Hold out ``fraction`` of the rows (seeded) for validation."""
    n = len(shard)
    n_val = int(round(n * fraction))
    if fraction <= 0 or n_val == 0:
        return shard, Shard(shard.x[:0], shard.y[:0])
    perm = np.random.default_rng(seed).permutation(n)
    va, tr = perm[:n_val], perm[n_val:]
    return Shard(shard.x[tr], shard.y[tr]), Shard(shard.x[va], shard.y[va])


def epoch_batches(n: int, batch_size: int, steps: int, seed: int, rank: int, epoch: int,
                  round_: int = 0) -> list[np.ndarray]:
    """Index arrays for one epoch: a seeded permutation, padded by resampling to ``steps`` full batches.

    Every worker takes the same number of steps (collectives need that), each of
    ``batch_size`` rows: a worker with fewer rows than the largest one, and the
    last batch of every epoch, draw their missing rows again. A short last batch
    would take a full learning-rate step on a gradient averaged over a few rows,
    and the model a run returns is the state right after its last steps (with
    asynchronous workers on digits, such a step cost a few points of test accuracy
    five times as often as a full one). When every worker's rows fit in one batch
    (``steps == 1``), that batch is the shard as it is. ``round_ >= 1`` draws a further
    permutation of the same epoch (see :class:`BatchRounds`).
    """
    rng = np.random.default_rng([seed, rank, epoch] if round_ == 0 else [seed, rank, epoch, 2, round_])
    perm = rng.permutation(n)
    short = steps * batch_size - n
    if steps > 1 and short > 0:
        perm = np.concatenate([perm, rng.integers(0, n, short)])
    return [perm[i * batch_size:(i + 1) * batch_size] for i in range(steps)]


class BatchRounds:
    """An epoch's batches followed by further rounds, for workers that take unequal numbers of steps.

    Round 0 is :func:`epoch_batches` of ``epoch``; round ``r >= 1`` is a fresh permutation of the
    same rows (seeded apart from every epoch's), built when first indexed.
    Where workers push asynchronously, a fast worker goes on into these rounds while a
    straggler takes fewer steps, until the job's batches for the epoch are spent; ``rounds``
    bounds the length (a worker alone would take every worker's share).
    """

    def __init__(self, n: int, batch_size: int, steps: int, seed: int, rank: int, epoch: int, rounds: int) -> None:
        self._args, self.steps, self.rounds = (n, batch_size, steps, seed, rank, epoch), steps, max(1, rounds)
        self._cached: tuple[int, list[np.ndarray]] | None = None

    def __len__(self) -> int:
        return self.steps * self.rounds

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        r = i // self.steps
        if self._cached is None or self._cached[0] != r:
            self._cached = (r, epoch_batches(*self._args, r))
        return self._cached[1][i % self.steps]


def batch_rng(seed: int, rank: int, epoch: int, batch: int) -> np.random.Generator:
    """The augmentation generator of one batch, seeded by the batch's place in the run.

    A run resumed mid-epoch therefore draws for each batch what the uninterrupted run
    drew, and a prefetch thread running ahead of the step cannot shift the stream.
    """
    return np.random.default_rng([seed, rank, epoch, 1, batch])


def iterate(x: torch.Tensor, y: torch.Tensor, batches: Sequence[np.ndarray] | BatchRounds, augment: Augment | None,
            rng_of: Callable[[int], np.random.Generator], prefetch: bool,
            start: int = 0) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
    """Yield ``(xb, yb)`` for ``batches[start:]``; batch ``i`` is augmented with ``rng_of(i)``.

    With ``prefetch`` the next batch is built in a thread meanwhile; a consumer that stops early
    (closes the generator) also stops the thread.
    """
    def make(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.from_numpy(batches[i]).to(x.device)  # the rows live on the run's device, the index with them
        xb = x.index_select(0, t)
        if augment is not None:  # augmentations are numpy functions: on the host, and the batch back
            xb = torch.from_numpy(np.ascontiguousarray(augment(xb.cpu().numpy(), rng_of(i)),
                                                       dtype=np.float32)).to(x.device)
        return xb, y.index_select(0, t)

    made = (make(i) for i in range(start, len(batches)))
    if not prefetch:
        yield from made
        return
    yield from prefetched(made)


def prefetched(items: Iterator[Any], depth: int = 2) -> Generator[Any, None, None]:
    """``items``, each made on a thread while the consumer works on the one before (up to ``depth`` ahead).

    A consumer that stops early (closes the generator) also stops the thread; an error raised while
    making an item is raised in the consumer.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put(item)
            q.put(None)
        except BaseException as err:  # re-raised in the consumer
            q.put(err)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # a producer blocked on the full queue sees ``stop`` once it can put
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
