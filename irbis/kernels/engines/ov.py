"""The OpenVINO engine: the exported ONNX file compiled for the CPU.

The CPU plugin runs bf16 by default on processors with bf16 instructions; fp32 is asked for
explicitly (``INFERENCE_PRECISION_HINT``) so that the engine equals eager fp32. ``precision="bf16"``
runs the stem (up to the first tensor after the first convolution, :mod:`irbis.kernels.engines.split`)
in fp32 and the rest in bf16: two compiled graphs chained, which keeps top-1 of real photographs.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from irbis.kernels.device import is_cuda
from irbis.kernels.engines import EngineError, Runner
from irbis.kernels.engines.exported import contiguous, huge_page_malloc

_HINTS = {"fp32": "f32", "bf16": "bf16"}


def load(path: str, *, threads: int, device: str, precision: str, **_options: Any) -> Runner:
    """A runner over ``path`` compiled by OpenVINO with ``threads`` threads, latency hint.

    ``_options`` (the int8 calibration sample) are not used: int8 runs on ONNX Runtime or torch.
    """
    if precision == "bf16" and not is_cuda(device):
        parts = compile_mixed(path, threads=threads)
    else:
        parts = [compile_graph(path, threads=threads, device=device, precision=precision)]
    return Chained(parts)


class Chained:
    """Run compiled parts in turn, each reading the previous one's output tensor without a copy.

    ``release`` (called after each call of the mini-batch loop) hands the parts' activation buffers
    back where malloc gives huge pages (:func:`irbis.kernels.engines.exported.huge_page_malloc`);
    elsewhere OpenVINO keeps them for the next batch, as refilling them costs a third of the throughput.
    """

    def __init__(self, parts: list[Any]) -> None:
        self.parts, self.requests = parts, [part.create_infer_request() for part in parts]
        self.lock, self.free_buffers = threading.Lock(), huge_page_malloc()

    def __call__(self, *inputs: np.ndarray) -> np.ndarray | list[np.ndarray]:
        with self.lock:
            self.requests[0].infer({i: contiguous(x) for i, x in enumerate(inputs)})
            last = self.requests[0]
            for request in self.requests[1:]:
                request.set_input_tensor(last.get_output_tensor(0))
                request.infer()
                last = request
            # Output tensors belong to the request and are overwritten by its next call: copy them.
            outputs = [np.array(t.data, copy=True) for t in last.output_tensors]
            return outputs[0] if len(outputs) == 1 else outputs

    def run(self, fetches: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs ``fetches`` of a graph compiled whole for the named ``feeds``."""
        if len(self.parts) != 1:
            raise EngineError("outputs are fetched by name from a graph compiled whole (fp32)")
        with self.lock:
            result = self.requests[0].infer({k: np.ascontiguousarray(v) for k, v in feeds.items()})
            return [np.array(result[self.parts[0].output(name)], copy=True) for name in fetches]

    def release(self) -> None:
        """Free the intermediate buffers of every part (allocated again by the next call), with huge pages."""
        if not self.free_buffers:
            return
        with self.lock:
            for part in self.parts:
                part.release_memory()


def compile_mixed(path: str, *, threads: int) -> list[Any]:
    """The ONNX file at ``path`` compiled as a fp32 stem and a bf16 rest (the whole in bf16 without a stem)."""
    import openvino as ov

    from irbis.kernels.engines.split import read_stem_cut

    cut = read_stem_cut(path)
    if cut is None:
        return [compile_graph(path, threads=threads, precision="bf16")]
    core = ov.Core()
    stem_model, rest_model = core.read_model(path), core.read_model(path)
    stem = ov.Model([_output_named(stem_model, cut)], stem_model.get_parameters(), "stem")
    edge = _output_named(rest_model, cut)
    start = ov.op.Parameter(edge.get_element_type(), edge.get_partial_shape())
    for target in list(edge.get_target_inputs()):
        target.replace_source_output(start.output(0))
    rest = ov.Model(rest_model.get_results(), [start], "rest")
    return [compile_graph(stem, threads=threads, precision="fp32"),
            compile_graph(rest, threads=threads, precision="bf16")]


def _output_named(model: Any, name: str) -> Any:
    for op in model.get_ordered_ops():
        for output in op.outputs():
            if name in output.get_names():
                return output
    raise EngineError(f"OpenVINO read no tensor named {name!r} from the exported network")


def compile_graph(path: Any, *, threads: int, device: str = "cpu", precision: str = "fp32") -> Any:
    """The ONNX file at ``path`` (or an ``openvino.Model``) compiled for the CPU (an ``openvino.CompiledModel``)."""
    import openvino as ov

    if is_cuda(device):
        raise EngineError("engine='openvino' runs on the CPU here (its GPU plugin is for Intel GPUs); "
                          "use engine='torch' or 'onnxruntime' with device='cuda'")
    if precision not in _HINTS:
        raise EngineError(f"engine='openvino' runs precision fp32 or bf16, got {precision!r}; "
                          f"use engine='torch' for {precision}")
    # No pinning: the CPU plugin pins its threads to cores by default, and every process picks the same
    # first cores, so two Spark workers of one thread each shared one core and ran at half speed. Unpinned,
    # MiniLM int8 on local[2] runs well above one thread's rate (``benchmarks/results/text.txt``).
    config = {"INFERENCE_PRECISION_HINT": _HINTS[precision], "INFERENCE_NUM_THREADS": str(max(1, threads)),
              "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False}
    try:
        return ov.Core().compile_model(path, "CPU", config)
    except Exception as err:  # noqa: BLE001 - OpenVINO raises RuntimeError with the operator's name
        raise EngineError(f"OpenVINO cannot run {path}: {err}") from err
