"""The OpenVINO engine: the exported ONNX file compiled for the CPU.

The CPU plugin runs bf16 by default on processors with bf16 instructions; fp32 is asked for
explicitly (``INFERENCE_PRECISION_HINT``) so that the engine equals eager fp32.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from irbis.kernels.engines import EngineError, Runner

_HINTS = {"fp32": "f32", "bf16": "bf16"}


def load(path: str, *, threads: int, device: str, precision: str) -> Runner:
    """A runner over ``path`` compiled by OpenVINO with ``threads`` threads, latency hint."""
    compiled = compile_graph(path, threads=threads, device=device, precision=precision)
    request, lock = compiled.create_infer_request(), threading.Lock()

    def run(x: np.ndarray) -> np.ndarray:
        with lock:
            # The output tensor belongs to the request and is overwritten by its next call: copy it.
            return np.array(request.infer({0: np.ascontiguousarray(x, dtype=np.float32)})[0], copy=True)

    return run


def compile_graph(path: str, *, threads: int, device: str = "cpu", precision: str = "fp32") -> Any:
    """The ONNX file at ``path`` compiled for the CPU (an ``openvino.CompiledModel``)."""
    import openvino as ov

    if device == "cuda":
        raise EngineError("engine='openvino' runs on the CPU here (its GPU plugin is for Intel GPUs); "
                          "use engine='torch' or 'onnxruntime' with device='cuda'")
    if precision not in _HINTS:
        raise EngineError(f"engine='openvino' runs precision fp32 or bf16, got {precision!r}; "
                          f"use engine='torch' for {precision}")
    config = {"INFERENCE_PRECISION_HINT": _HINTS[precision], "INFERENCE_NUM_THREADS": str(max(1, threads)),
              "PERFORMANCE_HINT": "LATENCY"}
    try:
        return ov.Core().compile_model(path, "CPU", config)
    except Exception as err:  # noqa: BLE001 - OpenVINO raises RuntimeError with the operator's name
        raise EngineError(f"OpenVINO cannot run {path}: {err}") from err
