"""``ONNXModel``: run an ONNX graph over DataFrame columns through ONNX Runtime."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, StructType

from irbis.kernels.blocks import BatchFn
from irbis.kernels.onnx import (
    ONNX_ENGINES,
    OPTIMIZATION_LEVELS,
    OnnxKernel,
    graph_signature,
    input_dtypes,
)
from irbis.ml.base import IrbisModel
from irbis.ml.network_params import NetworkStageParams, check_network_input, check_sequence_input
from irbis.ml.params import Row, one_of, param_mixin, table_mixin
from irbis.ml.synapseml import ONNXModelNames


# -- SynapseML's ONNXModel Params (its names that alias Irbis Params are in irbis.ml.synapseml) ------
def toColumnMap(value: Any) -> dict[str, str]:  # noqa: N802 (named like PySpark's converters)
    """Param converter: a dict of column name -> column name."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TypeError(f"expected a dict of column name -> column name, found {value!r}")
    return dict(value)


def _column_map(value: Any) -> dict[str, str]:
    return dict(value)


_ONNX_ROWS: list[Row] = [
    ("feedDict", "graph input name -> input column", _column_map, None),
    ("fetchDict", "output column -> graph output (or inner node output) name", _column_map, None),
    ("softMaxDict", "SynapseML's softmax heads: output column -> new column holding the softmax of its "
     "scores (a vector)", toColumnMap, {}),
    ("argMaxDict", "SynapseML's argmax heads: output column (or softMaxDict column) -> new column holding "
     "the index of its largest score (a double, the predicted label)", toColumnMap, {}),
    ("optimizationLevel", "ONNX Runtime's graph optimisations: NO_OPT, BASIC_OPT, EXTENDED_OPT or ALL_OPT",
     TypeConverters.toString, "ALL_OPT", one_of(*OPTIMIZATION_LEVELS)),
]


HasOnnxEngine: Any = param_mixin("engine", "what runs the graph: onnxruntime, openvino (fp32, CPU) or auto (ONNX "
                                 "Runtime, else OpenVINO: the first installed)", TypeConverters.toString, "auto",
                                 one_of(*ONNX_ENGINES))


_ONNXParams: Any = table_mixin("_ONNXParams", _ONNX_ROWS)


class ONNXModel(NetworkStageParams, HasOnnxEngine, _ONNXParams, ONNXModelNames,
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
        path = self.getNetwork()
        if not Path(path).is_file():
            raise FileNotFoundError(f"ONNX model file not found: {path}")
        feeds = self._feeds()
        return OnnxKernel(path, feeds, self._fetches(), self._shapes(), input_dtypes(path),
                          input_dtype=self.getInputDtype(), batch_size=self.getMiniBatchSize(),
                          device=self.getDevice(), engine=self.getEngine(), level=self.getOptimizationLevel(),
                          softmax=self.getSoftMaxDict(), argmax=self.getArgMaxDict(),
                          sequence=_sequence_feeds(feeds) if self.getVariableLength() else None,
                          token_budget=self.getTokenBudget())

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
