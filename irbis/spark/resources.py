"""What the cluster offers, as far as Spark's configuration says it, read on the driver; and in a task, the
cores that the task may use (:func:`task_cores`, :func:`set_task_threads`, :class:`SharedCores`).

Local masters (``local``, ``local[N]``, ``local[*]``, ``local-cluster[...]``) run their executors on the
driver's machine: their task slots are known from the master string at once, and a GPU is there exactly
when the driver sees one. On other masters Spark exposes GPUs only through resource scheduling
(``spark.executor.resource.gpu.amount``); without it the first task finds out.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from irbis.errors import ParamValueError
from irbis.kernels.device import TASK_GPU_SETTING

_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\d+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]")


def conf(session: Any, key: str, default: str | None = None) -> str | None:
    """``session.conf.get(key, default)``, or ``default`` where the server does not expose the key."""
    try:
        return session.conf.get(key, default)
    except Exception:  # noqa: BLE001 - Spark Connect refuses some keys
        return default


def master(session: Any) -> str:
    """The session's ``spark.master`` ("" when unknown)."""
    return conf(session, "spark.master", "") or ""


def driver_host(session: Any) -> str:
    """The driver's address as its executors reach it (``spark.driver.host``; 127.0.0.1 when unset)."""
    return conf(session, "spark.driver.host", "127.0.0.1") or "127.0.0.1"


def is_local_master(session: Any) -> bool:
    """True for masters whose executors run on the driver's machine."""
    m = master(session)
    return bool(_LOCAL.fullmatch(m) or _LOCAL_CLUSTER.fullmatch(m))


def local_slots(session: Any) -> int | None:
    """Tasks a local master runs at once (cores / ``spark.task.cpus``), or None for other masters."""
    m, cpus = master(session), int(conf(session, "spark.task.cpus", "1") or 1)
    local, cluster = _LOCAL.fullmatch(m), _LOCAL_CLUSTER.fullmatch(m)
    if local:
        cores = local.group(1) or "1"
        return (os.cpu_count() or 1 if cores == "*" else int(cores)) // cpus
    if cluster:
        return int(cluster.group(1)) * (int(cluster.group(2)) // cpus)
    return None


def executor_slots(session: Any) -> int | None:
    """Tasks one executor runs at once (its cores / ``spark.task.cpus``): from the master string on a local
    master (``local[N]``: N; ``local-cluster[n, c, m]``: c), else from ``spark.executor.cores`` where the
    session sets it; None where neither says (a standalone executor that takes all its worker's cores)."""
    m = master(session)
    if _LOCAL.fullmatch(m):
        return local_slots(session)
    cpus = int(conf(session, "spark.task.cpus", "1") or 1)
    cluster = _LOCAL_CLUSTER.fullmatch(m)
    if cluster:
        return int(cluster.group(2)) // cpus
    cores = conf(session, "spark.executor.cores")
    return int(cores) // cpus if cores and cores.isdigit() else None


def default_parallelism(session: Any) -> int:
    """The session's default number of partitions: ``sparkContext.defaultParallelism`` on a classic
    session; through Spark Connect (no SparkContext) ``spark.default.parallelism`` where the server sets
    it, else the tasks a local master runs at once, else 2."""
    if not type(session).__module__.startswith("pyspark.sql.connect"):  # a classic session
        return int(session.sparkContext.defaultParallelism)
    given = conf(session, "spark.default.parallelism")
    return int(given) if given else local_slots(session) or 2


def check_device(session: Any, device: str) -> None:
    """Refuse on the driver a ``device`` that the cluster surely cannot give.

    Raises
    ------
    irbis.errors.ParamValueError
        For ``cuda`` on a local master without a visible CUDA device, or where Spark's resource scheduling
        gives the executors no GPU; for ``cuda`` or ``auto`` where the executors have GPUs but
        ``spark.task.resource.gpu.amount`` gives them to no task (every task would take the first). Elsewhere
        the first task checks (:mod:`irbis.kernels.device`).
    """
    if device == "cpu":
        return
    gpus = conf(session, "spark.executor.resource.gpu.amount")
    task = conf(session, TASK_GPU_SETTING)
    if gpus is not None and float(gpus) > 0:
        if task is None or float(task) <= 0:
            raise ParamValueError("device", device, f"'cpu', or set {TASK_GPU_SETTING} (1 for one task per GPU, "
                                  "0.5 for two tasks sharing one): the executors have GPUs, but Spark assigns "
                                  "them to no task, so every task would take the first")
        return
    if device != "cuda":
        return
    if is_local_master(session):
        import torch

        if not torch.cuda.is_available():
            raise ParamValueError("device", device, f"'cpu' or 'auto': the master {master(session)!r} runs "
                                  "on this machine, which has no CUDA device")
    elif gpus is not None:
        raise ParamValueError("device", device, "'cpu' or 'auto': spark.executor.resource.gpu.amount is "
                              f"{gpus}, so the executors have no GPU")


def set_task_threads(share: SharedCores | None) -> None:
    """Give the kernels of this Spark task its cores before a batch: ``share``'s count now
    (:meth:`SharedCores.threads`), to torch, OpenCV and the engines (:func:`irbis.kernels.threads.set_threads`,
    which imports neither torch nor OpenCV); ``None`` (outside a task) leaves them as they are."""
    from irbis.kernels.threads import set_threads

    if share is not None:
        set_threads(share.threads())


#: Where the tasks of one executor register while they run (:class:`SharedCores`): a folder per executor.
SHARE_ROOT = Path(tempfile.gettempdir()) / "irbis-cores"
_REGISTRATIONS = itertools.count()  # one name per registration of this process (a task may run two kernels)
#: How long a task that finds itself alone at its first batch waits for the others of its stage to register.
GRACE_S = 0.1


class SharedCores:
    """The cores of one executor, shared among the Irbis tasks it runs at once.

    Spark gives a task ``spark.task.cpus`` cores whatever runs beside it, so an input of one partition
    (one small Parquet file is one) runs one task on one core while the executor's other cores idle. A
    task that runs a kernel registers here for as long as it runs (a file it holds locked, in a folder of
    its executor: the Python workers of an executor are the children of one process), and
    :meth:`threads` gives it ``cpus * (slots // tasks running)``: the whole executor when it runs alone,
    its own cores when the executor is full. The count is read again at every Arrow batch, so a task that
    started alone gives the cores back as others start (:meth:`threads`). No partition count is needed
    (Spark Connect has none), and the rows and their order are the input's.

    Parameters
    ----------
    cpus : int
        The task's own cores (``TaskContext.cpus()``).
    slots : int or None
        Tasks the executor runs at once (:func:`executor_slots`, read on the driver); None or 1: the task
        keeps its own cores.
    """

    def __init__(self, cpus: int, slots: int | None, root: Path | None = None, task: int | None = None,
                 grace_s: float = GRACE_S) -> None:
        self.cpus, self.slots = max(1, cpus), slots or 1
        self.folder = (root or SHARE_ROOT) / str(os.getppid())
        self.task = os.getpid() if task is None else task
        self.grace_s = grace_s
        self._held: Any = None
        self._path: Path | None = None
        self._threads: int | None = None

    def __enter__(self) -> SharedCores:
        if self.slots > 1:
            self.folder.mkdir(parents=True, exist_ok=True)
            name = f"{self.task}-{os.getpid()}-{next(_REGISTRATIONS)}"
            partial = self.folder / f".{name}"
            held = open(partial, "w")  # noqa: SIM115 - held (and locked) until __exit__
            fcntl.flock(held, fcntl.LOCK_EX)
            self._path = self.folder / name
            os.replace(partial, self._path)  # only locked files carry a task's name: none is counted unlocked
            self._held = held
        return self

    def __exit__(self, *exc: object) -> None:
        if self._held is not None:
            with contextlib.suppress(OSError):
                assert self._path is not None
                self._path.unlink()
            self._held.close()  # releases the lock
            self._held = self._path = None

    def running(self) -> int:
        """The tasks of this executor registered now, this one included (a task that runs two stages'
        kernels registers twice and counts once); a file left by a process that died unlocked is removed."""
        if self._held is None:
            return 1
        tasks = {self.task}
        for path in self.folder.iterdir():
            if path.name.startswith(".") or path == self._path:
                continue
            try:
                with open(path) as other:
                    fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                tasks.add(int(path.name.split("-")[0]))  # held by a running task
            except (OSError, ValueError):
                continue  # gone meanwhile, or not a task's
            else:
                with contextlib.suppress(OSError):
                    path.unlink()  # nobody holds it: its task has ended without removing it
        return len(tasks)

    def threads(self) -> int:
        """This task's cores now: ``cpus * max(1, slots // running)``, and never more than it had at its
        previous call: a task gives cores back as others start but takes no more later, since the kernels
        load an engine per thread count (a task's tail is not worth an engine's compile).

        At the first call, a task that finds itself alone waits up to ``grace_s`` for others: the tasks of a
        stage start together but reach their first batch some milliseconds apart, and a task that took every
        core for a whole batch beside another would put more threads than cores to work."""
        running = self.running()
        if self._threads is None and running == 1 and self._held is not None:
            deadline = time.monotonic() + self.grace_s
            while running == 1 and time.monotonic() < deadline:
                time.sleep(0.02)
                running = self.running()
        share = self.cpus * max(1, self.slots // running)
        self._threads = share if self._threads is None else min(share, self._threads)
        return self._threads


@contextlib.contextmanager
def task_cores(slots: int | None) -> Iterator[SharedCores | None]:
    """Set up a Spark task for its kernels, once: record the GPU Spark assigned it, which the one device rule
    reads (:func:`assign_task_device`), and hold its :class:`SharedCores` of an executor running ``slots``
    tasks at once while the block runs (:func:`set_task_threads` reads it before each batch); outside a task,
    None.

    It runs in the stages' Arrow and pandas UDFs, which refer to it by name: a Python worker that unpickles
    a UDF imports this module, which imports neither ``pyspark.ml`` nor torch (the stages' module,
    :mod:`irbis.ml.base`, imports both)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        yield None
        return
    assign_task_device(context)
    with SharedCores(context.cpus(), slots, task=context.taskAttemptId()) as share:
        yield share


def assign_task_device(context: Any) -> None:
    """Record the GPU addresses Spark assigned the task of ``context`` (a ``TaskContext``), so that every
    network of the task runs on them (:mod:`irbis.kernels.device`; Spark sets no ``CUDA_VISIBLE_DEVICES``
    for Python workers)."""
    from irbis.kernels.device import Assignment, assign_task

    gpu = context.resources().get("gpu")
    assign_task(Assignment(tuple(gpu.addresses) if gpu is not None else (), context.partitionId()))


__all__ = ["GRACE_S", "SHARE_ROOT", "SharedCores", "assign_task_device", "check_device", "conf", "default_parallelism",
           "executor_slots", "is_local_master", "local_slots", "master", "set_task_threads", "task_cores"]
