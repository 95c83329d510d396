"""Fault injection, for tests and benchmarks only: not part of Irbis's API for training.

Both hooks pickle by reference (a module-level function bound with :func:`functools.partial`, an
instance of a module-level class), so they reach the workers of any backend, Spark's included:

* :func:`kill_once` is an ``augment`` callable (the estimator's and the training spec's augmentation
  hook, run on every batch): it kills the first worker process to reach its ``after``-th batch with
  SIGKILL, as a lost executor or an out-of-memory kill would. A marker file, created atomically, makes it
  once per run across processes and retries.
* :class:`Stragglers` is a ``step_hook`` (:class:`~irbis.train.loop.TrainSpec`): the ranks it names run
  slower by their factor, each sleeping ``factor - 1`` times its compute time before every step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

import numpy as np

_calls = [0]  # batches this process has augmented so far


def kill_once(marker: str, after: int, batch: np.ndarray, rng: object) -> np.ndarray:
    """Return ``batch`` unchanged, except that the first process to see its ``after``-th batch dies once.

    Examples
    --------
    >>> from functools import partial
    >>> estimator.augment = partial(kill_once, "/shared/killed", 80)   # doctest: +SKIP
    """
    _calls[0] += 1
    if _calls[0] == after:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return batch
        os.kill(os.getpid(), signal.SIGKILL)
    return batch


@dataclass(frozen=True)
class Stragglers:
    """Slow ranks: rank -> factor (>= 1) by which its steps are slower.

    Called with a worker's rank, it gives the context manager the loop enters around each of that worker's
    steps (a no-op for the ranks it does not name): on entering, it sleeps ``factor - 1`` times the time since
    the last step ended (the worker's compute), before the step communicates.

    Examples
    --------
    >>> spec = TrainSpec.of(network, strategy="downpour", step_hook=Stragglers({0: 3.0}))   # doctest: +SKIP
    """

    factors: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {r: f for r, f in self.factors.items() if not f >= 1.0}
        if bad:
            raise ValueError(f"a straggler's factor must be >= 1, found {bad}")

    def __call__(self, rank: int) -> contextlib.AbstractContextManager[None]:
        factor = float(self.factors.get(rank, 1.0))
        return _Straggler(factor) if factor > 1.0 else contextlib.nullcontext()


class _Straggler:
    """One worker's straggling, entered around each of its steps."""

    def __init__(self, factor: float) -> None:
        self.factor, self.last = factor, None  # type: float, float | None

    def __enter__(self) -> None:
        if self.last is not None:
            time.sleep((self.factor - 1.0) * (time.perf_counter() - self.last))

    def __exit__(self, *exc: object) -> None:
        self.last = time.perf_counter()


__all__ = ["Stragglers", "kill_once"]
