"""The ONNX Runtime engine: one session per exported file, fp32 on the CPU or CUDA, or int8 on the CPU.

``precision="int8"`` runs the file quantised by :func:`irbis.kernels.engines.quantize.quantized_path`
(static, calibrated on the ``calibration`` sample), or without a sample by
:func:`irbis.kernels.engines.quantize.dynamic_path` (dynamic, fully connected layers only); both are cached
beside the export.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from irbis.kernels.calibration import Calibration
from irbis.kernels.device import cuda_index, is_cuda
from irbis.kernels.engines import EngineError, Runner
from irbis.kernels.engines.exported import contiguous, huge_page_malloc

#: Whether the intra-op threads go on spin-waiting after a run ends (ONNX Runtime's default). Spinning
#: suits back-to-back batches (Spark). A server waits on the network between requests: its sessions stop
#: spinning when each run ends, so idle threads leave the cores to decoding and the event loop, while
#: within a run the threads still spin between operators (turning spinning off altogether costs every
#: lone image its threads' wake-ups).
_SPIN_BETWEEN_RUNS = [True]


def set_thread_spinning(between_runs: bool) -> None:
    """Set whether sessions loaded from now on keep spinning after each run (see :data:`_SPIN_BETWEEN_RUNS`)."""
    _SPIN_BETWEEN_RUNS[0] = bool(between_runs)


def load(path: str, *, threads: int, device: str, precision: str, calibration: Calibration | None = None,
         shape: tuple[int, ...] = (), level: str = "ORT_ENABLE_ALL") -> Runner:
    """A runner over an ONNX Runtime session of ``path`` with ``threads`` intra-op threads, graph
    optimisation ``level``, on ``device`` (a name :func:`irbis.kernels.device.task_device` gave).

    For int8, ``calibration`` is the sample that sets the activation ranges and ``shape`` the input
    row shape it must have; without a sample the file is quantised dynamically.
    """
    import onnxruntime as ort

    path = _int8_path(path, device, calibration, shape) if precision == "int8" else path
    if precision not in ("fp32", "int8"):
        raise EngineError(f"engine='onnxruntime' runs precision fp32 or int8, got {precision!r}; "
                          f"use engine='openvino' or 'torch' for {precision}")
    if is_cuda(device) and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise EngineError("device='cuda' was asked for, but ONNX Runtime has no CUDA provider here "
                          "(pip install onnxruntime-gpu)")
    providers: list[Any] = ([("CUDAExecutionProvider", {"device_id": cuda_index(device)})] if is_cuda(device)
                            else []) + ["CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(path, session_options(threads, level), providers=providers)
    except Exception as err:  # noqa: BLE001 - ORT raises its own exception types per failure
        raise EngineError(f"ONNX Runtime cannot run {path}: {err}") from err
    return Session(session)


class Session:
    """An ONNX Runtime session as a runner: the graph's inputs in order in, its output (or outputs) out;
    :meth:`run` fetches outputs by name."""

    def __init__(self, session: Any) -> None:
        self.session, self.names = session, [i.name for i in session.get_inputs()]

    def __call__(self, *inputs: np.ndarray) -> np.ndarray | list[np.ndarray]:
        outputs = self.session.run(None, {name: contiguous(x) for name, x in zip(self.names, inputs)})
        return outputs[0] if len(outputs) == 1 else outputs

    def run(self, fetches: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs ``fetches`` of the graph for the named ``feeds``."""
        return self.session.run(fetches, feeds)


def session_options(threads: int, level: str = "ORT_ENABLE_ALL") -> Any:
    """The options of every ONNX Runtime session of Irbis: ``threads`` intra-op threads, graph
    optimisation ``level`` (a name of ``onnxruntime.GraphOptimizationLevel``), spinning as
    :func:`set_thread_spinning` last set it, and the CPU memory arena off where malloc gives huge pages.

    The arena keeps the activation buffers of the largest batch for the life of the session (about
    330 MiB per Python worker for EfficientNet-Lite0 at batch 32); without it they go back to the OS
    after each run. Fresh memory is cheap only with huge pages (:func:`huge_page_malloc`): elsewhere
    the arena stays on, as turning it off costs a third of the throughput in page faults.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.enable_cpu_mem_arena = not huge_page_malloc()
    if not _SPIN_BETWEEN_RUNS[0]:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


def _int8_path(path: str, device: str, calibration: Calibration | None, shape: tuple[int, ...]) -> str:
    from irbis.kernels.engines.quantize import dynamic_path, quantized_path

    if is_cuda(device):
        raise EngineError("engine='onnxruntime' runs precision='int8' on the CPU only")
    return str(dynamic_path(path) if calibration is None else quantized_path(path, calibration, shape))
