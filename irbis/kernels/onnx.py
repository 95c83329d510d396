"""ONNX graphs as pure batch functions through ONNX Runtime: dict of arrays in, dict of arrays out.

A graph is loaded by the engines of :mod:`irbis.kernels.engines` (ONNX Runtime or OpenVINO) into the
process cache, keyed by the file's identity, the requested outputs, the engine, the task's device and the
thread count, so a Spark Python worker loads each graph once. Any node output of the graph can be fetched
(for transfer learning): it is added to the graph's outputs, in a copy written once beside the prepared
weights, before the graph is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from irbis.kernels.blocks import Tensor, flat_rows, from_rows
from irbis.kernels.device import task_device
from irbis.kernels.engines import ENGINES, cached, candidates
from irbis.kernels.engines.exported import TRIM_BYTES, release_memory
from irbis.kernels.inference import source_identity

DictBatchFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

#: SynapseML's optimisation levels (the ``optimizationLevel`` Param) -> ONNX Runtime's enum names.
OPTIMIZATION_LEVELS = {"NO_OPT": "ORT_DISABLE_ALL", "BASIC_OPT": "ORT_ENABLE_BASIC",
                       "EXTENDED_OPT": "ORT_ENABLE_EXTENDED", "ALL_OPT": "ORT_ENABLE_ALL"}

_ONNX_TO_NUMPY = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}


def graph_signature(path: str) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Input and output names of a graph with their shapes (``None`` for dynamic axes)."""
    session = _runner(path, (), "onnxruntime", "cpu", 1).session
    shape = lambda a: tuple(d if isinstance(d, int) else None for d in a.shape)  # noqa: E731
    return ({a.name: shape(a) for a in session.get_inputs()},
            {a.name: shape(a) for a in session.get_outputs()})


def input_dtypes(path: str) -> dict[str, type]:
    """numpy dtype expected by each graph input."""
    session = _runner(path, (), "onnxruntime", "cpu", 1).session
    return {a.name: _ONNX_TO_NUMPY.get(a.type, np.float32) for a in session.get_inputs()}


#: What runs an ONNX graph: auto (the first installed of ONNX Runtime and OpenVINO), onnxruntime or openvino.
ONNX_ENGINES = ("auto", "onnxruntime", "openvino")


def onnx_engine(engine: str) -> str:
    """The engine that runs an ONNX graph here: ``engine``, or for ``auto`` the first installed of
    onnxruntime and openvino (``auto_order``'s ``onnx`` row; an ImportError naming the package to install
    when neither is)."""
    if engine != "auto":
        return engine
    for name in candidates(engine, "cpu", "fp32", kind="onnx"):
        return name
    raise ImportError("engine='auto' runs an ONNX graph on ONNX Runtime or OpenVINO, and neither is installed: "
                      "pip install onnxruntime")


def make_onnx_predict_fn(path: str, fetches: Sequence[str], *, batch_size: int = 64,
                         device: str = "cpu", num_threads: int = 1, engine: str = "auto",
                         optimization_level: str = "ALL_OPT") -> DictBatchFn:
    """Return ``fn(feeds) -> outputs`` running the graph at ``path`` in mini-batches.

    ``fetches`` may name graph outputs or any inner node output. Outputs are concatenated over the
    mini-batches along the first axis. ``engine`` is ``onnxruntime``, ``openvino`` (fp32, CPU) or ``auto``
    (:func:`onnx_engine`);
    ``optimization_level`` (ONNX Runtime) is a key of :data:`OPTIMIZATION_LEVELS`.
    """
    known_outputs = set(graph_signature(path)[1])
    extra = tuple(sorted(set(fetches) - known_outputs))
    fetch_list = list(fetches)
    engine = onnx_engine(engine)
    if engine not in ONNX_ENGINES[1:]:
        raise ValueError(f"engine must be 'onnxruntime' or 'openvino' for an ONNX graph, got {engine!r}")
    session = _runner(path, extra, engine, device, num_threads, optimization_level)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(next(iter(feeds.values())))
        parts: list[list[np.ndarray]] = [[] for _ in fetch_list]
        for start in range(0, n, batch_size):
            chunk = {k: v[start:start + batch_size] for k, v in feeds.items()}
            for i, out in enumerate(session.run(fetch_list, chunk)):
                parts[i].append(out)
        if sum(v.nbytes for v in feeds.values()) >= TRIM_BYTES:
            release_memory(session)
        return {name: np.concatenate(p) if p else np.zeros((0,)) for name, p in zip(fetch_list, parts)}

    return run


def _rows(values: np.ndarray, dtype: type | None = None) -> np.ndarray:
    """``(N, ...)`` as ``(N, D)``, also for N = 0."""
    values = np.asarray(values, dtype)
    return values.reshape(len(values), int(np.prod(values.shape[1:])))


def softmax_rows(values: np.ndarray) -> np.ndarray:
    """Softmax of each row of ``(N, ...)`` scores over all its elements, in float64."""
    from irbis.kernels.sparkml.predictors import softmax

    return softmax(_rows(values, np.float64))


def argmax_rows(values: np.ndarray) -> np.ndarray:
    """Index of the largest element of each row of ``(N, ...)`` scores, as float64 (a label)."""
    rows = _rows(values)
    return rows.argmax(axis=1).astype(np.float64) if rows.size else np.zeros(len(rows))


def apply_heads(outputs: dict[str, np.ndarray], softmax: dict[str, str],
                argmax: dict[str, str]) -> dict[str, np.ndarray]:
    """Add SynapseML's ``softMaxDict`` and ``argMaxDict`` columns to ``outputs`` (column -> rows).

    Each dict maps an existing column to a new one; softmax columns are computed first, so an
    ``argmax`` entry may read a softmax column.
    """
    out = dict(outputs)
    for heads, fn in ((softmax, softmax_rows), (argmax, argmax_rows)):
        for source, target in heads.items():
            if source not in out:
                raise ValueError(f"column {source!r} is not an output of the graph's fetches; "
                                 f"known outputs: {sorted(out)}")
            out[target] = fn(out[source])
    return out


def output_blocks(results: dict[str, np.ndarray], fetches: dict[str, str], softmax: dict[str, str],
                  argmax: dict[str, str], valid: np.ndarray) -> dict[str, Any]:
    """ONNXModel's output blocks: fetched tensors and softmax heads as vector rows, argmax heads as
    doubles (a label), each with the null rows of ``valid``."""
    empty = np.zeros((0, 1), np.float32)
    cols = {out: results[name] if results else empty for out, name in fetches.items()}
    cols = apply_heads(cols, softmax, argmax)
    blocks: dict[str, Any] = {n: from_rows(cols[n], valid) for n in argmax.values()}
    for name in [*fetches, *softmax.values()]:
        blocks[name] = Tensor(flat_rows(cols[name].astype(np.float32, copy=False) if results else None), valid)
    return blocks


def _runner(path: str, extra_outputs: tuple[str, ...], engine: str, device: str, num_threads: int,
            optimization_level: str = "ALL_OPT") -> Any:
    """The process's runner of the graph at ``path`` (its inner outputs ``extra_outputs`` exposed) on
    ``engine``, on the task's device (:func:`irbis.kernels.device.task_device`)."""
    if optimization_level not in OPTIMIZATION_LEVELS:
        raise ValueError(f"optimizationLevel {optimization_level!r} is not one of {list(OPTIMIZATION_LEVELS)}")
    device = task_device(device)
    identity = source_identity({"kind": "onnx", "path": path})
    level = OPTIMIZATION_LEVELS[optimization_level] if engine == "onnxruntime" else ""
    key = json.dumps(["onnx", identity, extra_outputs, engine, device, num_threads, level])

    def load() -> Any:
        if not Path(path).is_file():
            raise FileNotFoundError(f"ONNX model file not found: {path}")
        graph = _graph_file(path, extra_outputs, identity) if extra_outputs else path
        options = {"level": level} if level else {}
        return ENGINES[engine].load(graph, threads=num_threads, device=device, precision="fp32", **options)

    return cached(key, load)


def _with_outputs(path: str, names: tuple[str, ...]) -> bytes:
    """The graph with inner node outputs ``names`` exposed as graph outputs."""
    import onnx

    model = onnx.load(path)
    produced = {o for node in model.graph.node for o in node.output}
    missing = [n for n in names if n not in produced]
    if missing:
        some = sorted(produced)[:30]
        raise ValueError(f"outputLayer {missing[0]!r} is not a node output of {path}; some node outputs: {some}")
    typed = {v.name: v for v in model.graph.value_info}
    for name in names:
        model.graph.output.append(typed.get(name) or onnx.helper.make_empty_tensor_value_info(name))
    return model.SerializeToString()


def _graph_file(path: str, names: tuple[str, ...], identity: str) -> str:
    """The graph at ``path`` with the inner outputs ``names`` exposed, written once beside the prepared weights."""
    import hashlib

    from irbis.kernels.engines import onnx_path
    from irbis.models.fetch import atomic_path, file_lock

    digest = hashlib.sha256(repr((identity, names)).encode()).hexdigest()[:24]
    dest = onnx_path(f"graph-{digest}")
    with file_lock(dest.parent / ".locks" / f"graph-{digest}.lock"):
        if not dest.exists():
            with atomic_path(dest) as tmp:
                tmp.write_bytes(_with_outputs(path, names))
    return str(dest)


@dataclass(frozen=True)
class OnnxKernel:
    """ONNXModel's kernel as a plain, picklable value: the graph file and how its feeds, fetches and heads map
    to columns; called on a dict of column blocks, it gives the output blocks.

    ``feeds`` maps each graph input to its column, ``fetches`` each output column to a graph output (or inner
    node output), ``shapes`` and ``dtypes`` give each input's row shape and numpy type. With ``sequence``
    (the graph input of the padded values and the one of the mask, or None), the column's variable-length
    rows run in length-aware batches of ``token_budget`` padded steps. :attr:`files` names the graph file,
    which a runner that moves the kernel to another machine rewrites with :meth:`relocated`.
    """

    path: str
    feeds: dict[str, str]
    fetches: dict[str, str]
    shapes: dict[str, Any]
    dtypes: dict[str, Any]
    input_dtype: str = "float32"
    batch_size: int = 64
    device: str = "cpu"
    engine: str = "auto"
    level: str = "ALL_OPT"
    softmax: dict[str, str] = field(default_factory=dict)
    argmax: dict[str, str] = field(default_factory=dict)
    sequence: tuple[str, str | None] | None = None
    token_budget: int = 4096

    @property
    def files(self) -> tuple[str, ...]:
        """The local file the kernel reads: the graph."""
        return (self.path,)

    def relocated(self, paths: dict[str, str]) -> OnnxKernel:
        """This kernel reading its graph at ``paths[path]`` (a copy shipped to this machine)."""
        return replace(self, path=paths.get(self.path, self.path))

    def _predict(self) -> DictBatchFn:
        from irbis.kernels.threads import task_threads

        return make_onnx_predict_fn(self.path, list(self.fetches.values()), batch_size=self.batch_size,
                                    device=self.device, num_threads=task_threads(), engine=self.engine,
                                    optimization_level=self.level)

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        from irbis.kernels.batching import network_batch

        if self.sequence is not None:
            return self._sequences(blocks)
        predict = self._predict()
        batches = {k: network_batch(blocks[col], col, self.shapes[k], input_dtype=self.input_dtype,
                                    dtype=self.dtypes[k], stage="ONNXModel") for k, col in self.feeds.items()}
        masks = [b.valid for b in batches.values()]
        valid = np.logical_and.reduce(masks)
        if len(self.feeds) > 1 and any(not m.all() for m in masks):
            bad = next(c for c, m in zip(self.feeds.values(), masks) if not m.all())
            raise ValueError(f"ONNXModel: column {bad!r} has nulls; with several feeds, drop them first")
        results = predict({k: b.values for k, b in batches.items()}) if valid.any() else {}
        return output_blocks(results, self.fetches, self.softmax, self.argmax, valid)

    def _sequences(self, blocks: dict[str, Any]) -> dict[str, Any]:
        from irbis.kernels.batching import sequence_rows
        from irbis.kernels.sequences import check_row_output, run_by_length

        values_input, mask_input = self.sequence  # type: ignore[misc]
        col = self.feeds[values_input]
        rows, errors = sequence_rows(blocks[col], col)
        bad = next((i for i, e in enumerate(errors) if e and e != "null row"), None)
        if bad is not None:
            raise ValueError(f"ONNXModel: column {col!r} row {bad} has no usable sequence ({errors[bad]})")
        valid = np.array([r is not None for r in rows], bool)
        if not valid.any():
            return output_blocks({}, self.fetches, self.softmax, self.argmax, valid)
        predict = self._predict()

        def run_batch(x: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
            feed = {values_input: x.astype(self.dtypes[values_input], copy=False)}
            if mask_input:
                feed[mask_input] = mask.astype(self.dtypes[mask_input], copy=False)
            out = predict(feed)
            for value in out.values():
                check_row_output(value.shape, x.shape[0], x.shape[1])
            return out

        results, _ = run_by_length([r for r in rows if r is not None], run_batch, token_budget=self.token_budget,
                                   max_rows=self.batch_size)
        return output_blocks(results, self.fetches, self.softmax, self.argmax, valid)
