"""Worker processes that make batches beside the step: the CPU work the GIL would serialise, in parallel.

Decoding an image in OpenCV releases the GIL, so threads (:func:`~irbis.kernels.threads.for_each_row`) decode
in parallel; but what runs between the calls (augmentation drawn row by row, numpy glue, the training step's
own Python) holds it, and with a fast device the task's one interpreter, not its cores, bounds the rate:
PyTorch's ``DataLoader`` uses worker processes for that reason. :class:`Feed` is that pool for Irbis's
streams: ``feed.map(fn, jobs)`` runs the picklable ``fn`` over ``jobs`` in up to ``processes`` worker
processes, at most ``depth`` jobs in flight (memory stays flat whatever the data), and yields the results
in the order of the jobs, so that a seeded run makes the same batches with or without it.

The processes start with ``spawn`` (a Spark Python worker has threads; forking it is unsafe) once per
process and size, and are kept for the next epoch and the next task of the same Python worker; a numpy
array (as a torch tensor) or a torch tensor comes back through shared memory (torch's multiprocessing
reductions), not a copy through a pipe. An error in a job is raised in the consumer, with its message.

:func:`feed_processes` is the rule for how many: ``"auto"`` starts none on a CPU device (the processes would
take the cores the step uses) and, on a GPU, one per CPU of the task but the one that drives the device.

Examples
--------
>>> feed_processes("auto", "cpu", cpus=16)
0
>>> feed_processes("auto", "cuda:0", cpus=16)
15
>>> feed_processes("4", "cuda:0", cpus=16)
4
"""
from __future__ import annotations

import atexit
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any, TypeVar

import numpy as np

__all__ = ["FEED_PROCESSES_DOC", "Feed", "check_feed_processes", "feed", "feed_processes"]

T = TypeVar("T")
R = TypeVar("R")

#: The meaning of a feedProcesses value (the Params' doc says it once, from here).
FEED_PROCESSES_DOC = ("worker processes that decode and augment image rows beside the training step, as "
                      "DataLoader's workers: 'auto' (none on a CPU device, where they would take the step's "
                      "cores; on a GPU, the task's CPUs less one), or a count (0: threads in the task's process)")


def check_feed_processes(value: str) -> None:
    """Raise ``ValueError`` where ``value`` is no feedProcesses value."""
    if not (value == "auto" or (value.isdigit() and int(value) >= 0)):
        raise ValueError(f"feedProcesses must be 'auto' or a count of processes (0 or more), got {value!r}")


def feed_processes(value: str | int, device: str, cpus: int) -> int:
    """The worker processes ``value`` (a feedProcesses value) means for a task on ``device`` with ``cpus``."""
    text = str(value)
    check_feed_processes(text)
    if text != "auto":
        return int(text)
    return 0 if device == "cpu" else max(0, cpus - 1)


def _init_worker() -> None:
    """In each worker: one thread for the libraries (the parallelism is the processes), torch's shared-memory
    reductions for what goes back."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        import torch.multiprocessing  # noqa: F401  (registers the shared-memory reductions)

        torch.set_num_threads(1)
    except ImportError:
        pass
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:
        pass


class _Shared:
    """A job's numpy result on its way back: as a torch tensor, which torch's reductions send through shared
    memory (a numpy array would be pickled whole through the pipe)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def _run_shared(fn: Callable[[T], R], job: T) -> Any:
    """``fn(job)`` in a worker, a numpy array wrapped for the trip back (see :class:`_Shared`)."""
    out = fn(job)
    if isinstance(out, np.ndarray) and out.dtype.kind in "biuf":
        import torch

        return _Shared(torch.from_numpy(np.ascontiguousarray(out)))
    return out


def _unwrap(out: Any) -> Any:
    return out.tensor.numpy() if isinstance(out, _Shared) else out


class Feed:
    """A pool of ``processes`` worker processes mapping a function over jobs in order, ``depth`` in flight."""

    def __init__(self, processes: int, depth: int | None = None) -> None:
        if processes < 1:
            raise ValueError(f"a Feed needs at least one process, got {processes}")
        self.processes = processes
        self.depth = depth or 2 * processes
        self._pool = ProcessPoolExecutor(processes, mp_context=get_context("spawn"), initializer=_init_worker)

    def map(self, fn: Callable[[T], R], jobs: Iterable[T]) -> Iterator[R]:
        """``fn(job)`` for each job, in the jobs' order, made in the processes up to ``depth`` ahead of the
        consumer. Closing the iterator early cancels the jobs not started."""
        pending: deque[Future[R]] = deque()
        jobs = iter(jobs)
        try:
            for job in jobs:
                pending.append(self._pool.submit(_run_shared, fn, job))
                if len(pending) >= self.depth:
                    yield _unwrap(pending.popleft().result())
            while pending:
                yield _unwrap(pending.popleft().result())
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


_FEEDS: dict[int, Feed] = {}
_LOCK = threading.Lock()


def feed(processes: int) -> Feed:
    """The process's :class:`Feed` of ``processes`` workers, started on first use and kept until exit."""
    with _LOCK:
        pool = _FEEDS.get(processes)
        if pool is None:
            pool = _FEEDS[processes] = Feed(processes)
        return pool


@atexit.register
def _close_feeds() -> None:
    for pool in _FEEDS.values():
        pool.close()
    _FEEDS.clear()
