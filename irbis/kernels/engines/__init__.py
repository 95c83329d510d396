"""Inference engines that run an exported network: ONNX Runtime and OpenVINO, beside eager PyTorch.

An engine is a small object picked by name from :data:`ENGINES`: the pip package that provides it,
and ``load(path, threads=, device=, precision=)`` returning a runner (a float32 batch in, the output
out; a list of outputs for a graph with several) for an ONNX file written by
:func:`irbis.kernels.engines.export.export_onnx`.

``auto`` follows :func:`auto_order`, a rule measured with ``benchmarks/inference.py`` in the layout
Spark gives a network (one process per task core, one thread each, batch 64, fp32). On
EfficientNet-Lite0, plain loops of 2 processes x 1 thread ran ONNX Runtime at 229 images/s, OpenVINO
at 159 and eager channels-last PyTorch at 44, and inside Spark (local[2]) ``TorchModel`` ran ONNX
Runtime at 127 and OpenVINO at 108. (In one process with 2 threads OpenVINO leads, 239 against 186:
``benchmarks/engine_rule.py``.) So for fp32 on the CPU ``auto`` tries ``onnxruntime``, then
``openvino``, then ``torch``, taking the first that is installed and runs the network. For bf16 on a
CPU with native bf16 instructions it tries ``openvino`` (stem in fp32, the rest in bf16: top-1
agreement 1.000 with fp32 on the crops of ``irbis models check``), then ``torch``; for int8 it tries
``onnxruntime`` (static, calibrated), then ``torch`` (dynamic); on CUDA it picks ``torch``. The rule costs nothing
at run time: no measurement, one import check per engine (and, for bf16, one look at OpenVINO's CPU
capabilities).

PyTorch's own dynamic int8 (``torch.ao.quantization``) is deprecated, so ``engine="torch"`` at int8 runs
the same recipe on the export: :func:`exported_engine` names ONNX Runtime for it, with the fully
connected layers quantised dynamically (:func:`irbis.kernels.engines.quantize.dynamic_path`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from irbis.kernels.device import is_cuda

Runner = Callable[[np.ndarray], "np.ndarray | list[np.ndarray]"]

#: The values of the ``engine`` Param; ``torch`` is eager PyTorch, ``auto`` follows :func:`auto_order`.
ENGINE_NAMES = ("auto", "torch", "onnxruntime", "openvino")


class EngineError(RuntimeError):
    """An engine cannot run a network (an unsupported operator, a failed export or compilation)."""


class InputShapeError(RuntimeError):
    """The network refuses a batch of this shape (raised by every engine, at export or at run time).

    Not an :class:`EngineError`: another engine would refuse the same rows, so ``auto`` does not try one.
    """


def onnx_path(key: str, cache_dir: Path | None = None) -> Path:
    """Where the ONNX export of ``key`` lives: the folder of the prepared weights, shared by the machine."""
    from irbis.models.fetch import default_cache_dir

    return (cache_dir or default_cache_dir()) / "prepared" / f"{key}.onnx"


def export_lock_path(path: Path) -> Path:
    """The lock file that whoever writes the ONNX file at ``path`` holds while writing it."""
    return path.parent / ".locks" / f"{path.stem}.lock"


@dataclass(frozen=True)
class Engine:
    """An engine that runs ONNX files: its import name, its pip package and its loader's module."""

    name: str
    module: str
    package: str
    loader: str

    def installed(self) -> bool:
        """Whether the engine's package can be imported here (a cheap check: no import)."""
        return importlib.util.find_spec(self.module) is not None

    def load(self, path: str, *, threads: int, device: str, precision: str, **options: Any) -> Runner:
        """A runner for the ONNX file at ``path``; a missing package names the one to install.

        ``options`` go to the loader (for int8: ``calibration``, the sample, and ``shape``, the input row).
        """
        if not self.installed():
            raise ImportError(f"engine={self.name!r} needs the {self.package!r} package: "
                              f"pip install {self.package}")
        loader: Any = importlib.import_module(self.loader)
        return loader.load(path, threads=threads, device=device, precision=precision, **options)


ENGINES: dict[str, Engine] = {
    "onnxruntime": Engine("onnxruntime", "onnxruntime", "onnxruntime", "irbis.kernels.engines.ort"),
    "openvino": Engine("openvino", "openvino", "openvino", "irbis.kernels.engines.ov"),
}


def auto_order(device: str, precision: str) -> tuple[str, ...]:
    """The engines ``auto`` tries, in order, for this device and precision (see the module docstring)."""
    if is_cuda(device):
        return ("torch",)
    if precision == "bf16":
        return ("openvino", "torch") if native_bf16() else ("torch",)
    if precision == "int8":
        return ("onnxruntime", "torch") if ENGINES["onnxruntime"].installed() else ("torch",)
    return tuple(n for n in ("onnxruntime", "openvino") if ENGINES[n].installed()) + ("torch",)


@functools.cache
def native_bf16() -> bool:
    """Whether OpenVINO is installed and reports bf16 instructions on this CPU."""
    if not ENGINES["openvino"].installed():
        return False
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def exported_engine(name: str, precision: str) -> str | None:
    """The engine of :data:`ENGINES` that runs the export of the network for the engine ``name`` at
    ``precision``: None for eager ``torch``, ONNX Runtime for ``torch`` at int8 (dynamic), else ``name``."""
    if name == "torch":
        return "onnxruntime" if precision == "int8" else None
    return name


def candidates(engine: str, device: str, precision: str) -> tuple[str, ...]:
    """The engines to try for the ``engine`` Param: the one named, or the ``auto`` order."""
    if engine not in ENGINE_NAMES:
        raise ValueError(f"engine must be one of {ENGINE_NAMES}, got {engine!r}")
    return auto_order(device, precision) if engine == "auto" else (engine,)
