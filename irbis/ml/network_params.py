"""The Params and input checks that the stages running a network over a column share (TorchModel, ONNXModel)."""

from __future__ import annotations

from typing import Any

from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    FloatType,
    IntegralType,
    NumericType,
    StringType,
    StructType,
)

from irbis.kernels.inference import resolve_source
from irbis.ml.column_types import is_image_struct
from irbis.ml.params import (
    ColumnSetters,
    HasDevice,
    HasInputDtype,
    HasInputShape,
    HasMiniBatchSize,
    HasNetwork,
    HasOutputLayer,
    HasTokenBudget,
    HasVariableLength,
    one_of,
    param_mixin,
)
from irbis.models import CatalogueEntry
from irbis.spark.columns import steps_of_features

__all__ = ["NetworkStageParams", "check_network_input", "check_sequence_input"]


HasVectorOrArrayFormat: Any = param_mixin("outputFormat", "vector (Spark ML vector) or array (array<float>)",
                                     TypeConverters.toString, "vector", one_of("vector", "array"))


class NetworkStageParams(ColumnSetters, HasNetwork, HasMiniBatchSize, HasDevice, HasInputShape, HasInputDtype,
                         HasOutputLayer, HasVectorOrArrayFormat, HasTokenBudget, HasVariableLength):
    """Params and input checks of a stage that runs a network over one column (TorchModel, ONNXModel)."""

    _accepts = frozenset({"vector", "image"})  # vectors and arrays of numbers, images, tensor bytes

    def _ragged_columns(self) -> frozenset[str]:
        return frozenset(self._input_columns()) if self.getVariableLength() else frozenset()

    def _output_columns(self) -> list[tuple[str, DataType]]:
        out = VectorUDT() if self.getOutputFormat() == "vector" else ArrayType(FloatType())
        return [(self.getOutputCol(), out)]

    def _validate_network_params(self) -> None:
        if not self.isDefined(self.network):
            raise ValueError(f"{type(self).__name__}: set network (or build the stage with from_module)")

    def _validate_schema(self, schema: StructType) -> None:
        self._validate_network_params()
        col = self.getInputCol()
        if self.getVariableLength():
            check_sequence_input(type(self).__name__, col, schema[col].dataType)
        else:
            check_network_input(type(self).__name__, col, schema[col].dataType, self._row_shape())

    def _row_shape(self) -> list[int] | None:
        """inputShape, or the input shape of a repository model's card; None when neither is known."""
        if self.isDefined(self.inputShape):
            return self.getOrDefault(self.inputShape)
        source = resolve_source(self.getNetwork())
        if source["kind"] == "repository":
            return list(CatalogueEntry.from_dict(source["entry"]).input_shape) or None
        return None


def check_network_input(stage: str, column: str, dtype: DataType, shape: list[int] | None = None) -> None:
    """Accept Spark ML vectors, (nested) numeric arrays, image structs and tensor bytes (binary, with
    ``shape`` known); name the column otherwise."""
    inner = dtype
    while isinstance(inner, ArrayType):
        inner = inner.elementType
    ok = isinstance(dtype, (VectorUDT, BinaryType)) or (isinstance(dtype, ArrayType) and isinstance(inner, NumericType))
    ok = ok or is_image_struct(dtype)
    if not ok:
        raise TypeError(
            f"{stage}: column {column!r} has type {dtype.simpleString()}; expected a Spark ML vector, "
            f"an array of numbers (nested arrays allowed), an image struct or tensor bytes (binary)"
        )
    if isinstance(dtype, BinaryType) and not shape:
        raise ValueError(f"{stage}: column {column!r} holds tensor bytes (binary), which carry no shape; "
                         f"set inputShape (e.g. [3, 224, 224]) and inputDtype")


def check_sequence_input(stage: str, column: str, dtype: DataType) -> None:
    """With ``variableLength=True``, accept ``array<int>`` (token ids) and ``array<array<number>>`` (steps x
    features); name the column and the Param otherwise."""
    ids = isinstance(dtype, ArrayType) and isinstance(dtype.elementType, IntegralType)
    if not (ids or steps_of_features(dtype)):
        raise TypeError(f"{stage}: column {column!r} has type {dtype.simpleString()}, which is not a column of "
                        f"variable-length sequences; with variableLength=True it must hold array<int> (token "
                        f"ids) or array<array<float>> (steps x features); set variableLength=False for "
                        f"fixed-shape rows")


def error_column(stage: Any) -> list[tuple[str, DataType]]:
    """The ``errorCol`` output of a stage, when set: one reason per row that has no output."""
    err = stage.getErrorCol()
    return [(err, StringType())] if err else []
