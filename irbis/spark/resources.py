"""What the cluster offers, as far as Spark's configuration says it, read on the driver; and in a task, the
cores that the task owns (:func:`set_task_threads`).

Local masters (``local``, ``local[N]``, ``local[*]``, ``local-cluster[...]``) run their executors on the
driver's machine: their task slots are known from the master string at once, and a GPU is there exactly
when the driver sees one. On other masters Spark exposes GPUs only through resource scheduling
(``spark.executor.resource.gpu.amount``); without it the first task finds out.
"""

from __future__ import annotations

import os
import re
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


def set_task_threads() -> None:
    """Give the kernels of this Spark task the cores the task owns (``spark.task.cpus``): torch, OpenCV
    and the engines (:func:`irbis.kernels.threads.set_threads`, which imports neither torch nor OpenCV);
    and the GPU Spark assigned it, which the one device rule reads (:func:`assign_task_device`).

    It runs in the stages' Arrow and pandas UDFs, which refer to it by name: a Python worker that unpickles
    a UDF imports this module, which imports neither ``pyspark.ml`` nor torch (the stages' module,
    :mod:`irbis.ml.base`, imports both)."""
    from pyspark import TaskContext

    from irbis.kernels.threads import set_threads

    context = TaskContext.get()
    if context is not None:
        set_threads(context.cpus())
        assign_task_device(context)


def assign_task_device(context: Any) -> None:
    """Record the GPU addresses Spark assigned the task of ``context`` (a ``TaskContext``), so that every
    network of the task runs on them (:mod:`irbis.kernels.device`; Spark sets no ``CUDA_VISIBLE_DEVICES``
    for Python workers)."""
    from irbis.kernels.device import Assignment, assign_task

    gpu = context.resources().get("gpu")
    assign_task(Assignment(tuple(gpu.addresses) if gpu is not None else (), context.partitionId()))


__all__ = ["assign_task_device", "check_device", "conf", "default_parallelism", "is_local_master", "local_slots",
           "master", "set_task_threads"]
