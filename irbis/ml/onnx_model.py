"""``ONNXModel``: run an ONNX graph over DataFrame columns through ONNX Runtime."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, StructType

from irbis.kernels.batching import network_batch, sequence_rows
from irbis.kernels.blocks import BatchFn
from irbis.kernels.onnx import (
    ONNX_ENGINES,
    OPTIMIZATION_LEVELS,
    graph_signature,
    input_dtypes,
    make_onnx_predict_fn,
    output_blocks,
)
from irbis.ml.base import IrbisModel
from irbis.ml.network_params import NetworkStageParams, check_network_input, check_sequence_input
from irbis.ml.params import one_of, param_mixin, table_mixin
from irbis.ml.synapseml import ONNXModelNames
from irbis.spark.files import localize, ship_file


# -- SynapseML's ONNXModel Params (its names that alias Irbis Params are in irbis.ml.synapseml) ------
def toColumnMap(value: Any) -> dict[str, str]:  # noqa: N802 (named like PySpark's converters)
    """Param converter: a dict of column name -> column name."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TypeError(f"expected a dict of column name -> column name, found {value!r}")
    return dict(value)


def _column_map(value: Any) -> dict[str, str]:
    return dict(value)


_ONNX_ROWS = [
    ("feedDict", "graph input name -> input column", _column_map, None),
    ("fetchDict", "output column -> graph output (or inner node output) name", _column_map, None),
    ("softMaxDict", "SynapseML's softmax heads: output column -> new column holding the softmax of its "
     "scores (a vector)", toColumnMap, {}),
    ("argMaxDict", "SynapseML's argmax heads: output column (or softMaxDict column) -> new column holding "
     "the index of its largest score (a double, the predicted label)", toColumnMap, {}),
    ("optimizationLevel", "ONNX Runtime's graph optimisations: NO_OPT, BASIC_OPT, EXTENDED_OPT or ALL_OPT",
     TypeConverters.toString, "ALL_OPT", one_of(*OPTIMIZATION_LEVELS)),
]


HasOnnxEngine = param_mixin("engine", "what runs the graph: onnxruntime, openvino (fp32, CPU) or auto (ONNX Runtime, "
                            "else OpenVINO: the first installed)", TypeConverters.toString, "auto",
                            one_of(*ONNX_ENGINES))


class ONNXModel(NetworkStageParams, HasOnnxEngine, table_mixin("_ONNXParams", _ONNX_ROWS), ONNXModelNames,
                IrbisModel):
    """Run an ONNX graph over one or more columns with ONNX Runtime (or OpenVINO: ``engine``).

    Either ``inputCol``/``outputCol`` for a graph with one input (the first graph output, or
    ``outputLayer``, is returned), or SynapseML's ``feedDict`` (graph input -> column) and
    ``fetchDict`` (output column -> graph output or inner node output) for several.

    SynapseML's names work too: ``modelLocation`` and ``modelPayload`` (the graph's bytes) set
    ``network``, ``deviceType`` sets ``device``; ``softMaxDict`` and ``argMaxDict`` add the
    softmax (a vector) and the argmax (a double label) of an output column as new columns, and
    ``optimizationLevel`` picks ONNX Runtime's graph optimisations.

    With ``variableLength=True`` the input column holds sequences whose length varies per row
    (``array<int>`` token ids or ``array<array<float>>`` steps x features) and the graph takes them with
    dynamic batch and sequence axes: the graph input whose name holds ``mask`` gets the attention mask (1 on
    real steps), the other the padded ids (or steps), each cast to its graph input's type; both inputs may
    be mapped to the one column in ``feedDict``, or left to ``inputCol`` for a graph of one or two inputs.
    Rows are sorted by length within each Arrow batch, cut under ``tokenBudget`` padded tokens and
    ``miniBatchSize`` rows, padded to a multiple of 8, and the outputs (one per row; a per-step output is
    refused) come back in the rows' order. A null row gives null outputs; a row with a null inside or with
    no steps fails the batch with an error naming the column.

    Examples
    --------
    .. code-block:: python

        onnx = ONNXModel(network="resnet50.onnx", feedDict={"input": "pixels"},
                         fetchDict={"probability": "output"}, miniBatchSize=32)
        scored = onnx.transform(df)

        # SynapseML's spelling of the same stage:
        onnx = (ONNXModel().setModelLocation("resnet50.onnx").setFeedDict({"input": "pixels"})
                .setFetchDict({"rawPrediction": "output"}).setSoftMaxDict({"rawPrediction": "probability"})
                .setArgMaxDict({"rawPrediction": "prediction"}))
    """

    _vector_dtype = "float32"

    # -- feeds and fetches -----------------------------------------------------------------------
    def _feeds(self) -> dict[str, str]:
        if self.isDefined(self.feedDict):
            return dict(self.getOrDefault(self.feedDict))
        inputs = list(graph_signature(self.getNetwork())[0])
        if self.getVariableLength() and len(inputs) <= 2:
            return {name: self.getInputCol() for name in inputs}
        if len(inputs) != 1:
            raise ValueError(f"ONNXModel: the graph has inputs {inputs}; map each to a column with feedDict")
        return {inputs[0]: self.getInputCol()}

    def _fetches(self) -> dict[str, str]:
        if self.isDefined(self.fetchDict):
            return dict(self.getOrDefault(self.fetchDict))
        outputs = list(graph_signature(self.getNetwork())[1])
        return {self.getOutputCol(): self.getOutputLayer() or outputs[0]}

    def _input_columns(self) -> list[str]:
        return list(dict.fromkeys(self._feeds().values()))

    def _output_columns(self) -> list[tuple[str, DataType]]:
        out = VectorUDT() if self.getOutputFormat() == "vector" else ArrayType(FloatType())
        heads = [(n, VectorUDT()) for n in self.getSoftMaxDict().values()]
        return [(name, out) for name in self._fetches()] + heads + [
            (n, DoubleType()) for n in self.getArgMaxDict().values()]

    def _check_heads(self) -> None:
        """softMaxDict reads fetched columns, argMaxDict fetched or softmax columns; new names only."""
        known = list(self._fetches())
        for name, heads in (("softMaxDict", self.getSoftMaxDict()), ("argMaxDict", self.getArgMaxDict())):
            for source, target in heads.items():
                if source not in known:
                    raise ValueError(f"ONNXModel: {name} reads column {source!r}, which is not an output "
                                     f"of the stage; its outputs are {known}")
                if target in known:
                    raise ValueError(f"ONNXModel: {name} writes column {target!r}, already an output")
                known.append(target)

    def _validate_schema(self, schema: StructType) -> None:
        self._validate_network_params()
        inputs = graph_signature(self.getNetwork())[0]
        shapes = self._shapes()
        for graph_input, col in self._feeds().items():
            if graph_input not in inputs:
                raise ValueError(f"ONNXModel: feedDict names graph input {graph_input!r}; the graph's "
                                 f"inputs are {list(inputs)}")
            if self.getVariableLength():
                check_sequence_input("ONNXModel", col, schema[col].dataType)
            else:
                check_network_input("ONNXModel", col, schema[col].dataType, shapes.get(graph_input))
        self._check_heads()
        if self.getVariableLength():
            _sequence_feeds(self._feeds())

    def _shapes(self) -> dict[str, list[int] | None]:
        """Row shape per graph input: inputShape for a graph of one feed, else the graph's static dims."""
        user_shape = self.getOrDefault(self.inputShape) if self.isDefined(self.inputShape) else None
        single = len(self._feeds()) == 1
        return {k: list(user_shape) if user_shape and single else _static(v[1:])
                for k, v in graph_signature(self.getNetwork())[0].items()}

    def _make_batch_fn(self) -> BatchFn:
        # The function runs in the Python workers: it refers to nothing of this module (whose import
        # loads torch through irbis.ml.torch_model), so the workers do not import torch.
        path = self.getNetwork()
        if not Path(path).is_file():
            raise FileNotFoundError(f"ONNX model file not found: {path}")
        shipped = ship_file(path)
        feeds, fetches, shapes = self._feeds(), self._fetches(), self._shapes()
        dtypes, input_dtype = input_dtypes(path), self.getInputDtype()
        batch_size, device, engine = self.getMiniBatchSize(), self.getDevice(), self.getEngine()
        level, softmax, argmax = self.getOptimizationLevel(), self.getSoftMaxDict(), self.getArgMaxDict()
        if self.getVariableLength():
            values_input, mask_input = _sequence_feeds(feeds)
            col, budget = feeds[values_input], self.getTokenBudget()

            def run_sequences(blocks: dict[str, Any]) -> dict[str, Any]:
                from irbis.kernels.sequences import check_row_output, run_by_length
                from irbis.kernels.threads import task_threads

                rows, errors = sequence_rows(blocks[col], col)
                bad = next((i for i, e in enumerate(errors) if e and e != "null row"), None)
                if bad is not None:
                    raise ValueError(f"ONNXModel: column {col!r} row {bad} has no usable sequence ({errors[bad]})")
                valid = np.array([r is not None for r in rows], bool)
                if not valid.any():
                    return output_blocks({}, fetches, softmax, argmax, valid)
                predict = make_onnx_predict_fn(localize(path, shipped), list(fetches.values()),
                                               batch_size=batch_size, device=device, num_threads=task_threads(),
                                               engine=engine, optimization_level=level)

                def run_batch(x: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
                    feed = {values_input: x.astype(dtypes[values_input], copy=False)}
                    if mask_input:
                        feed[mask_input] = mask.astype(dtypes[mask_input], copy=False)
                    out = predict(feed)
                    for value in out.values():
                        check_row_output(value.shape, x.shape[0], x.shape[1])
                    return out

                results, _ = run_by_length([r for r in rows if r is not None], run_batch, token_budget=budget,
                                           max_rows=batch_size)
                return output_blocks(results, fetches, softmax, argmax, valid)

            return run_sequences

        def run(blocks: dict[str, Any]) -> dict[str, Any]:
            from irbis.kernels.threads import task_threads

            predict = make_onnx_predict_fn(localize(path, shipped), list(fetches.values()),
                                           batch_size=batch_size, device=device, num_threads=task_threads(),
                                           engine=engine, optimization_level=level)
            batches = {k: network_batch(blocks[col], col, shapes[k], input_dtype=input_dtype, dtype=dtypes[k],
                                        stage="ONNXModel") for k, col in feeds.items()}
            masks = [b.valid for b in batches.values()]
            valid = np.logical_and.reduce(masks)
            if len(feeds) > 1 and any(not m.all() for m in masks):
                bad = next(c for c, m in zip(feeds.values(), masks) if not m.all())
                raise ValueError(f"ONNXModel: column {bad!r} has nulls; with several feeds, drop them first")
            feed = {k: b.values for k, b in batches.items()}
            results = predict(feed) if valid.any() else {}
            return output_blocks(results, fetches, softmax, argmax, valid)

        return run

    def _save_extra(self, path: str) -> None:
        shutil.copy2(self.getNetwork(), Path(path) / "model.onnx")

    def _load_extra(self, path: str) -> None:
        saved = Path(path) / "model.onnx"
        if saved.exists():
            self._set(network=str(saved))


def _sequence_feeds(feeds: dict[str, str]) -> tuple[str, str | None]:
    """With variableLength: the graph input of the padded values and the one of the mask (None: no mask
    input), both read from one column; the input whose name holds ``mask`` is the mask."""
    masks = [k for k in feeds if "mask" in k.lower()]
    values = [k for k in feeds if k not in masks]
    if len(set(feeds.values())) != 1 or len(values) != 1 or len(masks) > 1:
        raise ValueError(f"ONNXModel: with variableLength=True the graph takes one sequence column: its values "
                         f"input and, optionally, a mask input (a name holding 'mask'); feedDict maps {feeds}")
    return values[0], masks[0] if masks else None


def _static(dims: tuple) -> list[int] | None:
    return [int(d) for d in dims] if dims and all(isinstance(d, int) for d in dims) else None
