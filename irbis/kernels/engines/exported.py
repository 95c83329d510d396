"""A network run by an exported engine, and the chain of engines ``auto`` tries in order.

Both are entries of the per-process network cache of :mod:`irbis.kernels.inference`, beside its eager
networks; they share its mini-batch loop (:func:`in_batches`). Nothing here imports torch: a worker
that finds the export of its network in the machine's cache runs it without loading torch (the eager
network is loaded, and torch imported, only to write that file).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from irbis.kernels.engines import ENGINES, EngineError, InputShapeError, Runner, export_lock_path, onnx_path
from irbis.models.fetch import file_lock

if TYPE_CHECKING:
    from torch import nn

_LOG = logging.getLogger("irbis.inference")


#: Input bytes from which a call hands its freed memory back to the OS: a smaller batch (one served
#: image is 0.6 MB) leaves little to return and would pay the trim, and the page faults after it, each time.
TRIM_BYTES = 4 << 20


def contiguous(x: np.ndarray) -> np.ndarray:
    """An engine's input: C-contiguous, a floating array as float32 (token ids and masks keep their type)."""
    x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=np.float32) if x.dtype.kind == "f" else np.ascontiguousarray(x)


def in_batches(run: Runner, x: np.ndarray, batch_size: int) -> np.ndarray | list[np.ndarray]:
    """``run`` over mini-batches of ``x`` (float32, contiguous), outputs flattened per row and joined.

    A ``run`` that returns a list (a network read at several layers) gives a list: each output joined.
    """
    outputs, several = [], False
    for start in range(0, len(x), batch_size):
        out = run(np.ascontiguousarray(x[start:start + batch_size], dtype=np.float32))
        several = isinstance(out, list)
        outs: list[np.ndarray] = out if isinstance(out, list) else [out]
        outputs.append([o.reshape(o.shape[0], -1) for o in outs])
    joined = [np.concatenate(parts) for parts in zip(*outputs)] or [np.zeros((0, 0), np.float32)]
    if x.nbytes >= TRIM_BYTES:
        release_memory(run)
    return joined if several else joined[0]


class Chain:
    """Run the first engine of ``networks`` (name, getter of the cached network) that works.

    Networks are got from the per-process cache (and loaded) only when tried. An engine that cannot
    run the network (:class:`EngineError`, or its package missing) is marked on its cached network and
    skipped from then on, after one log line naming the reason and the engine used instead; the last
    engine's error is raised.
    """

    def __init__(self, networks: list[tuple[str, Callable[[], Any]]], engine: str) -> None:
        self.networks, self.engine = networks, engine

    def predict(self, x: np.ndarray, batch_size: int, layer: Any) -> np.ndarray | list[np.ndarray]:
        for i, (name, get) in enumerate(self.networks):
            last, network = i + 1 == len(self.networks), get()
            if getattr(network, "failed", False) and not last:
                continue
            try:
                return network.predict(x, batch_size, layer)
            except (EngineError, ImportError) as err:
                if last:
                    raise
                network.failed = True
                _LOG.warning("engine=%r: %s cannot run this network (%s); using %s instead", self.engine,
                             name, err, self.networks[i + 1][0])
        raise AssertionError("unreachable: the last engine raises")


def export_key(identity: str, layer: str | tuple[str, ...] | None, shape: tuple[int, ...]) -> str:
    """The cache key of a network's ONNX export: its identity, the layer(s) it is cut at and the row shape."""
    return hashlib.sha256(json.dumps([identity, layer or "", [int(d) for d in shape]]).encode()).hexdigest()[:24]


class ExportedNetwork:
    """A network exported to ONNX (cut at its layer, or with one output per layer of a tuple of them) and
    run by an engine, compiled per input shape.

    ``load`` returns the eager network; it is called only when the export file does not exist yet.
    ``calibration`` (a getter of :class:`irbis.kernels.calibration.Calibration`) is the int8 sample.
    """

    def __init__(self, load: Callable[[], nn.Module], identity: str, engine: str, layer: str | tuple[str, ...] | None,
                 device: str, precision: str, threads: int, calibration: Callable[[], Any] | None = None) -> None:
        self.load, self.identity, self.engine, self.layer = load, identity, engine, layer
        self.device, self.precision, self.threads = device, precision, threads
        self.calibration = calibration
        self.runners: dict[tuple[int, ...], Runner] = {}
        self.lock = threading.Lock()

    def predict(self, x: np.ndarray, batch_size: int, layer: Any) -> np.ndarray | list[np.ndarray]:
        """The outputs for ``x`` (a list for several layers); an engine refusing a batch at run time raises
        :class:`InputShapeError`."""
        with self.lock:
            runner = self._runner(tuple(x.shape[1:]))
            try:
                return in_batches(runner, x, batch_size)
            except Exception as err:  # noqa: BLE001 - each engine raises its own types (ORT: not RuntimeError)
                lines = str(err).strip().splitlines() or [type(err).__name__]
                raise InputShapeError(f"{self.engine} refused a batch of shape {list(x.shape)}: "
                                      f"{lines[0][:500]}") from err

    def _runner(self, shape: tuple[int, ...]) -> Runner:
        if shape not in self.runners:
            key = export_key(self.identity, self.layer, shape)
            path = onnx_path(key)
            if not path.exists():  # written atomically, so an existing file is whole
                # another process may be writing it (the export ahead of the job): wait on its lock first,
                # without importing torch, which only a process that must export the network needs
                with file_lock(export_lock_path(path)):
                    pass
            if not path.exists():
                from irbis.kernels.engines.export import export_onnx

                path = export_onnx(self.load, self.layer, shape, key)
            self.runners[shape] = ENGINES[self.engine].load(str(path), threads=self.threads, device=self.device,
                                                            precision=self.precision, **self._int8_options(shape))
        return self.runners[shape]

    def _int8_options(self, shape: tuple[int, ...]) -> dict[str, Any]:
        if self.precision != "int8" or self.calibration is None:
            return {}
        return {"calibration": self.calibration(), "shape": shape}


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_memory(run: Any = None) -> None:
    """Hand the freed activation memory of a batch back to the OS (glibc keeps it otherwise).

    Without this a worker's resident memory stays at its peak (the activations of the largest batch)
    for as long as the worker lives, and Spark keeps its Python workers alive between jobs. A runner
    ``run`` with a ``release`` method (an engine that keeps its own activation buffers) releases them first.
    """
    release = getattr(run, "release", None)
    if release is not None:
        release()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


#: The glibc tunable that makes malloc back its large blocks with transparent huge pages. It is read
#: when a process starts, so it is set in the environment of the Python workers
#: (``spark.executorEnv.GLIBC_TUNABLES``, which :func:`irbis.get_spark` sets).
HUGE_PAGE_TUNABLE = "glibc.malloc.hugetlb=1"
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_page_malloc() -> bool:
    """Whether this process's malloc hands out huge pages for large blocks (:data:`HUGE_PAGE_TUNABLE`).

    Engines keep their activation buffers between batches (an arena) because fresh memory costs a
    page fault per 4 KiB page: on EfficientNet-Lite0 a third of the run time at batch 64. With huge
    pages that cost is small, so the engines hand their buffers back after each call instead, and an
    idle worker holds the weights and the engine's code, not the activations of its largest batch.
    """
    if HUGE_PAGE_TUNABLE not in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        return False
    try:
        return "[never]" not in _THP_MODE.read_text()
    except OSError:
        return False
