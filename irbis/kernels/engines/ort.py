"""The ONNX Runtime engine: one session per exported file, fp32, on the CPU or CUDA."""

from __future__ import annotations

import numpy as np

from irbis.kernels.engines import EngineError, Runner


def load(path: str, *, threads: int, device: str, precision: str) -> Runner:
    """A runner over an ONNX Runtime session of ``path`` with ``threads`` intra-op threads."""
    import onnxruntime as ort

    if precision != "fp32":
        raise EngineError(f"engine='onnxruntime' runs precision='fp32' only, got {precision!r}; "
                          f"use engine='openvino' or 'torch' for {precision}")
    providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    if device == "cuda" and providers[0] not in ort.get_available_providers():
        raise EngineError("device='cuda' was asked for, but ONNX Runtime has no CUDA provider here "
                          "(pip install onnxruntime-gpu)")
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        session = ort.InferenceSession(path, options, providers=providers)
    except Exception as err:  # noqa: BLE001 - ORT raises its own exception types per failure
        raise EngineError(f"ONNX Runtime cannot run {path}: {err}") from err
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)})[0]
