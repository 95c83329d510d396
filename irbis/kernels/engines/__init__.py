"""Inference engines that run an exported network: ONNX Runtime and OpenVINO, beside eager PyTorch.

An engine is a small object picked by name from :data:`ENGINES`: the pip package that provides it,
and ``load(path, threads=, device=, precision=)`` returning a runner for an ONNX file (an image or
tensor network written by :func:`irbis.kernels.engines.export.export_onnx`, a text network, a user's
graph): the graph's inputs in order in, its output out (a list of outputs for a graph with several),
and ``run(fetches, feeds)`` by name. Every network of a process (eager or exported, image, tensor,
text or ONNX graph) is held in the one process cache, :func:`cached`; its device is the task's
(:func:`irbis.kernels.device.task_device`).

``auto`` follows :func:`auto_order`, one table (:data:`AUTO_ORDER`) by input kind and precision. For
image and tensor networks the rule was measured with ``benchmarks/inference.py`` in the layout
Spark gives a network (one process per task core, one thread each, batch 64, fp32): on
EfficientNet-Lite0, in plain loops and inside Spark alike, ONNX Runtime led OpenVINO and both left eager
channels-last PyTorch far behind (in one process with 2 threads OpenVINO leads: ``benchmarks/engine_rule.py``;
the figures are on the performance page). So for fp32 on the CPU ``auto`` tries ``onnxruntime``, then
``openvino``, then ``torch``, taking the first that is installed and runs the network. For bf16 on a
CPU with native bf16 instructions it tries ``openvino`` (stem in fp32, the rest in bf16: the same top-1
as fp32 on the crops of ``irbis models check``), then ``torch``; for int8 it tries
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
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from irbis.kernels.device import is_cuda

Runner = Callable[..., "np.ndarray | list[np.ndarray]"]
T = TypeVar("T")

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

    def require(self) -> None:
        """Raise ImportError naming the package to install where the engine is not installed."""
        if not self.installed():
            raise ImportError(f"engine={self.name!r} needs the {self.package!r} package: "
                              f"pip install {self.package}")

    def load(self, path: str, *, threads: int, device: str, precision: str, **options: Any) -> Runner:
        """A runner for the ONNX file at ``path``; a missing package names the one to install.

        ``options`` go to the loader (for int8: ``calibration``, the sample, and ``shape``, the input row;
        for ONNX Runtime: ``level``, the graph optimisation level).
        """
        self.require()
        loader: Any = importlib.import_module(self.loader)
        return loader.load(path, threads=threads, device=device, precision=precision, **options)


ENGINES: dict[str, Engine] = {
    "onnxruntime": Engine("onnxruntime", "onnxruntime", "onnxruntime", "irbis.kernels.engines.ort"),
    "openvino": Engine("openvino", "openvino", "openvino", "irbis.kernels.engines.ov"),
}


#: The engines ``auto`` tries on the CPU, in order, by input kind and precision: ``tensor`` (image and tensor
#: networks, the rule of this module's docstring), ``text`` (:mod:`irbis.kernels.text_encoder` says why) and
#: ``onnx`` (a user's ONNX graph: the first installed). An exported engine that is not installed is left
#: out, OpenVINO at bf16 where the CPU has no bf16 instructions and at int8 without NNCF (text).
AUTO_ORDER: dict[tuple[str, str], tuple[str, ...]] = {
    ("tensor", "fp32"): ("onnxruntime", "openvino", "torch"),
    ("tensor", "bf16"): ("openvino", "torch"),
    ("tensor", "int8"): ("onnxruntime", "torch"),
    ("text", "fp32"): ("openvino", "torch", "onnxruntime"),
    ("text", "bf16"): ("openvino", "torch"),
    ("text", "int8"): ("openvino", "onnxruntime"),
    ("onnx", "fp32"): ("onnxruntime", "openvino"),
}
#: The input kinds of :data:`AUTO_ORDER`.
INPUT_KINDS = ("tensor", "text", "onnx")


def auto_order(device: str, precision: str, kind: str = "tensor") -> tuple[str, ...]:
    """The engines ``auto`` tries, in order, for this device, precision and input kind (:data:`AUTO_ORDER`;
    on CUDA, eager torch for a network of torch's, the ``onnx`` order for a graph)."""
    if kind not in INPUT_KINDS:
        raise ValueError(f"input kind must be one of {INPUT_KINDS}, got {kind!r}")
    if is_cuda(device) and kind != "onnx":
        return ("torch",)
    return tuple(name for name in AUTO_ORDER[kind, precision] if _usable(name, precision, kind))


def _usable(name: str, precision: str, kind: str) -> bool:
    if name == "torch":
        return True
    if name == "openvino" and precision == "bf16":
        return native_bf16()
    if name == "openvino" and precision == "int8" and kind == "text":
        return ENGINES[name].installed() and importlib.util.find_spec("nncf") is not None
    return ENGINES[name].installed() or (kind, precision) == ("text", "int8")  # names the package to install


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


def candidates(engine: str, device: str, precision: str, kind: str = "tensor") -> tuple[str, ...]:
    """The engines to try for the ``engine`` Param: the one named, or the ``auto`` order of ``kind``."""
    if engine not in ENGINE_NAMES:
        raise ValueError(f"engine must be one of {ENGINE_NAMES}, got {engine!r}")
    return auto_order(device, precision, kind) if engine == "auto" else (engine,)


_CACHE: dict[str, Any] = {}
_CACHE_LOCK = threading.RLock()  # an entry may load others (a text runner its tokenizer) while it loads


def cached(key: str, make: Callable[[], T]) -> T:
    """The process's one value for ``key``, made by ``make`` the first time: every loaded network and engine
    session of a process (a Spark worker's tasks, a server, a LIME loop share them), each keyed by what makes
    it differ (its source and files, its options, its device and thread count)."""
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = make()
        return _CACHE[key]


def cached_values() -> list[Any]:
    """What the process cache holds (to inspect it)."""
    with _CACHE_LOCK:
        return list(_CACHE.values())


def cached_keys() -> list[str]:
    """The keys of the process cache (to inspect it)."""
    with _CACHE_LOCK:
        return list(_CACHE)


def clear_cache() -> None:
    """Forget every network and session this process loaded (tests, a server reloading, to free memory)."""
    with _CACHE_LOCK:
        _CACHE.clear()
