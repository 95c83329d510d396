"""Export a network, whole or cut at an inner layer, to an ONNX file once per machine.

The file is written with the ``torch.export``-based ONNX exporter into the cache folder of the
prepared weights (``<cache>/prepared``), named by a key of the network's identity, the layer and the
input shape, under a file lock, atomically; every later process of the machine reads it as it is.
The batch axis is dynamic, so one file serves every mini-batch size.

In-place activation modules (``nn.ReLU6(inplace=True)`` and the like) are exported out of place: the
graph is the same (functionalisation turns each in-place op into its out-of-place form anyway), but
tracing an in-place op under a symbolic batch axis costs the exporter much more: exporting
EfficientNet-Lite0 cut at its pooled features took 6.3 and 9.0 s instead of 18.0 and 12.8 s in one
thread on a busy machine (see :func:`out_of_place`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from irbis.kernels.engines import EngineError, InputShapeError, export_lock_path, onnx_path
from irbis.models.fetch import atomic_path, file_lock


class CutNetwork(nn.Module):
    """``module`` returning the output of its inner module ``layer`` (the output itself when empty), or
    for a tuple of layers one output per layer, in order (a graph with several outputs).

    The forward pass runs to the end, but nothing after the last ``layer`` reaches an output, so the
    exporter drops that part of the graph.
    """

    def __init__(self, module: nn.Module, layer: str | tuple[str, ...] | None) -> None:
        super().__init__()
        self.module, self.layer = module, layer or ""

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if not self.layer:
            return self.module(x)
        layers = (self.layer,) if isinstance(self.layer, str) else self.layer
        seen: dict[str, Any] = {}
        handles = [self.module.get_submodule(name).register_forward_hook(
            lambda _m, _i, out, name=name: seen.setdefault(name, out[0] if isinstance(out, (tuple, list)) else out))
            for name in layers]
        try:
            self.module(x)
        finally:
            for handle in handles:
                handle.remove()
        return seen[self.layer] if isinstance(self.layer, str) else tuple(seen[name] for name in layers)


def export_onnx(load: Any, layer: str | tuple[str, ...] | None, input_shape: tuple[int, ...], key: str,
                cache_dir: Path | None = None) -> Path:
    """The ONNX file of ``load()`` (a callable returning the eager network) cut at ``layer`` (or with one
    output per layer of a tuple of them).

    ``load`` is called only when the file does not exist yet, so workers that find it skip loading
    the eager network; the file is written under its lock (:func:`irbis.kernels.engines.export_lock_path`),
    so a process that finds the lock taken waits for the file. The errors are :func:`write_onnx`'s.
    """
    path = onnx_path(key, cache_dir)
    with file_lock(export_lock_path(path)):
        if not path.exists():
            write_onnx(load(), layer, input_shape, path)
    return path


def write_onnx(module: nn.Module, layer: str | tuple[str, ...] | None, input_shape: tuple[int, ...],
               path: Path) -> None:
    """Write the ONNX export of ``module`` cut at ``layer`` to ``path`` (atomically); the caller holds its lock.

    A network the exporter cannot capture raises :class:`EngineError` with the exporter's reason (which
    names the unsupported operator); a network that refuses rows of ``input_shape`` when run eagerly
    raises :class:`InputShapeError` instead (no engine would take them).
    """
    network = CutNetwork(module, layer).eval()
    example = torch.zeros(2, *input_shape)
    try:
        with torch.no_grad():
            network(example)
    except RuntimeError as err:
        raise InputShapeError(_first_line(err)) from err
    try:
        with torch.no_grad(), warnings.catch_warnings(), _quiet(), out_of_place(network):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(network, (example,), dynamo=True, optimize=True, verbose=False,
                                        dynamic_shapes=({0: torch.export.Dim("batch")},))
    except Exception as err:  # noqa: BLE001 - the exporter fails in many ways; report its reason
        raise EngineError(f"the network cannot be exported to ONNX: {_first_line(err)}") from err
    if program is None:  # torch.onnx.export with dynamo=True returns the program
        raise EngineError("the network cannot be exported to ONNX: the exporter returned no program")
    with atomic_path(path) as tmp:
        program.save(str(tmp))


@contextlib.contextmanager
def out_of_place(module: nn.Module) -> Iterator[None]:
    """Run the submodules of ``module`` that take an ``inplace`` flag out of place, restoring the flags after.

    The outputs are the same; what changes is the exporter's work: each in-place op (``hardtanh_`` for
    ``ReLU6``) is decomposed into its out-of-place op and a ``copy_`` that ``torch.export`` and the ONNX
    exporter's decompositions re-trace with symbolic shapes, while the ONNX graph written is the same
    node for node (only the names of some intermediate values differ).
    """
    flagged: list[Any] = [m for m in module.modules() if getattr(m, "inplace", None) is True]
    for m in flagged:
        m.inplace = False
    try:
        yield
    finally:
        for m in flagged:
            m.inplace = True


@contextlib.contextmanager
def _quiet():
    """Silence the exporter's log lines (they would flood a Spark worker's log); its progress prints are off
    by ``verbose=False``, not by redirecting ``sys.stdout``, which would swallow every other thread's output
    meanwhile."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:500]
