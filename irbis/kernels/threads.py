"""The cores a kernel may use: recorded by the runner that calls it, read by the kernels.

A kernel never asks its runtime how many cores it owns. The runner says it before the first call:
Spark's Arrow runner (:mod:`irbis.ml.base`) records the task's ``spark.task.cpus``, the HTTP server its
own setting. :func:`set_threads` hands the count at once to the libraries already loaded (torch,
OpenCV) and keeps it for the engines that a kernel builds later (ONNX Runtime, OpenVINO), which read
it with :func:`task_threads`. Importing this module loads neither torch nor OpenCV.

Examples
--------
>>> set_threads(2)
>>> task_threads()
2
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

__all__ = ["default_threads", "for_each_row", "set_threads", "task_threads"]

_THREADS: list[int] = []  # the count set_threads last recorded


def set_threads(num_threads: int | None) -> None:
    """Record ``num_threads`` for every engine and give it to torch and OpenCV where they are loaded.

    ``None`` or a count below 1 leaves everything as it was.
    """
    if not num_threads or num_threads <= 0:
        return
    _THREADS[:] = [num_threads]
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(num_threads)


def default_threads() -> int:
    """What torch would use unless told: ``OMP_NUM_THREADS`` (PySpark sets it to the task's cores in its
    workers), else every core this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0))


def task_threads() -> int:
    """The intra-op threads of a kernel here: the count recorded by :func:`set_threads`, else what torch
    uses when it is loaded, else :func:`default_threads`."""
    if _THREADS:
        return _THREADS[0]
    if "torch" in sys.modules:
        return sys.modules["torch"].get_num_threads()
    return default_threads()


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def for_each_row(work: Callable[[int], None], rows: int, threads: int | None = None) -> None:
    """Call ``work(i)`` for every row ``i`` of ``range(rows)``, on up to ``threads`` threads
    (:func:`task_threads` by default): for per-row work that releases the GIL (OpenCV's decoding and
    resizing). The first row that raises, in row order, raises here, after every row has run.
    """
    threads = min(rows, threads or task_threads())
    if threads <= 1:
        for i in range(rows):
            work(i)
        return
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="irbis-rows")
    futures = [pool.submit(work, i) for i in range(rows)]
    wait(futures)  # every row has run before any error is raised
    for future in futures:
        future.result()
