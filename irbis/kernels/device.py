"""The one device rule: which device a network of this task runs on.

Every path that runs a network (inference, every engine, text, training workers, LIME's scoring) asks
:func:`task_device`, and the rule is:

1. ``cpu``: the CPU.
2. The GPU Spark assigned the task (``TaskContext.resources()["gpu"].addresses``, recorded by the Spark
   layer with :func:`assign_task` when the task starts): ``cuda:<address>``. Spark does not set
   ``CUDA_VISIBLE_DEVICES`` for Python workers, so without this every task would take ``cuda:0``. Tasks that
   share a GPU (``spark.task.resource.gpu.amount`` below 1) are given the same address.
3. No assignment, and several GPUs visible (local mode, or resource scheduling off): one per task,
   ``cuda:<partition mod GPUs>``, so that concurrent tasks spread over the GPUs.
4. One GPU visible: ``cuda:0``.
5. None: ``auto`` is the CPU; ``cuda`` is an error.

A task that Spark gave no GPU while the executor schedules GPUs (``required``) is an error that names the
setting: it would otherwise share a GPU that Spark gave another task.

The rule is :func:`task_device`, a pure function of the request, the assignment and the number of visible
GPUs (given, so that it is tested without a GPU; left out, the running task's and this machine's). Pure:
imports nothing of Spark; torch only to count GPUs.

Examples
--------
>>> task_device("auto", Assignment(("3",), partition=0), visible=4)
'cuda:3'
>>> task_device("auto", Assignment((), partition=5), visible=4)
'cuda:1'
>>> task_device("auto", Assignment((), partition=5), visible=0)
'cpu'
"""

from __future__ import annotations

from dataclasses import dataclass

#: the values of every stage's ``device`` Param
DEVICES = ("cpu", "cuda", "auto")
#: the Spark setting that gives each task its GPUs
TASK_GPU_SETTING = "spark.task.resource.gpu.amount"


@dataclass(frozen=True)
class Assignment:
    """What Spark gave the running task: its GPU addresses (empty: none), its partition, and whether the
    executor schedules GPUs (so that a task without one is a misconfiguration)."""

    addresses: tuple[str, ...] = ()
    partition: int | None = None
    required: bool = False


_assigned = Assignment()  # a Python worker runs one task at a time: the last task started is the running one


def assign_task(assignment: Assignment) -> None:
    """Record the running task's assignment (the Spark layer calls it as each task starts)."""
    global _assigned
    _assigned = assignment


def assigned() -> Assignment:
    """The running task's assignment; an empty one outside a Spark task."""
    return _assigned


def task_device(device: str, assignment: Assignment | None = None, visible: int | None = None) -> str:
    """The device name (``"cpu"`` or ``"cuda:N"``) that ``device`` means for a task with ``assignment`` on a
    machine with ``visible`` GPUs (the rule of the module docstring); left out, they are the running task's
    (:func:`assigned`) and this machine's (:func:`visible_gpus`), and a name that is already resolved
    (``cpu``, ``cuda:N``) stays as it is.

    Raises
    ------
    ValueError
        For a device outside :data:`DEVICES`, ``cuda`` where no GPU is visible, an assigned address that
        is not a visible GPU, and a task given no GPU by an executor that schedules them.
    """
    if assignment is None:
        if device == "cpu" or device.startswith("cuda:"):  # no torch needed to tell
            return device
        assignment = _assigned
    if visible is None:
        visible = visible_gpus()
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        return "cpu"
    if assignment.addresses:
        address = assignment.addresses[0]
        if not address.isdigit() or int(address) >= visible:
            raise ValueError(f"Spark assigned this task GPU {address!r}, but this worker sees {visible} CUDA "
                             "device(s) (0 to visible-1): check the executors' GPU discovery script and "
                             "CUDA_VISIBLE_DEVICES")
        return f"cuda:{int(address)}"
    if assignment.required:
        raise ValueError(f"Spark gave this task no GPU while its executor schedules GPUs: set {TASK_GPU_SETTING} "
                         "(1 for one task per GPU, 0.5 for two tasks sharing one), or use device='cpu'")
    if visible == 0:
        if device == "cuda":
            raise ValueError("device='cuda' was asked for, but no CUDA device is visible to this worker")
        return "cpu"
    return f"cuda:{(assignment.partition or 0) % visible}"


def visible_gpus() -> int:
    """The CUDA devices this process sees (0 without torch or without CUDA)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def is_cuda(device: str) -> bool:
    """Whether a device name (``cuda`` or ``cuda:N``) is a GPU."""
    return device == "cuda" or device.startswith("cuda:")


def cuda_index(device: str) -> int:
    """The ordinal of a ``cuda:N`` name (0 for a bare ``cuda``)."""
    return int(device.split(":", 1)[1]) if ":" in device else 0


__all__ = ["DEVICES", "TASK_GPU_SETTING", "Assignment", "assign_task", "assigned", "cuda_index", "is_cuda",
           "task_device", "visible_gpus"]
