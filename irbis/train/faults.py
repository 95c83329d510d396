"""Fault injection for tests and benchmarks: a worker process that dies mid-training, once per run.

:func:`kill_once` is an ``augment`` callable (the estimator's and :class:`~irbis.train.loop.TrainSpec`'s
augmentation hook, run on every batch), so it reaches the worker processes of any backend, Spark's
included, and kills the first one to reach its ``after``-th batch with SIGKILL, as a lost executor or an
out-of-memory kill would. A marker file, created atomically, makes it once per run across processes
and retries. Bind its first two arguments with :func:`functools.partial`, which pickles by reference.
"""

from __future__ import annotations

import os
import signal

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


__all__ = ["kill_once"]
