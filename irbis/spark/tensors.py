"""Binary tensor columns: each row holds the raw little-endian bytes of one tensor.

A network stage (``TorchModel``, ``ONNXModel``) reads such a column with ``inputShape`` and
``inputDtype`` as one zero-copy array per Arrow batch. Spark moves a ``binary`` row as one block of
bytes, where it converts an ``array<float>`` value by value on its way to Python: for 3x224x224
images the binary column moves several times faster.

* :func:`tensor_bytes_column`: turn an ``array<...>`` or Spark ML vector column of a DataFrame into
  one (public DataFrame API only, so it runs on Spark Connect too);
* :func:`irbis.kernels.blocks.tensor_bytes`: the same from numpy, e.g. to write parquet with pyarrow.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator

from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, NumericType
from pyspark.util import PythonEvalType

from irbis.kernels.batching import TENSOR_DTYPES
from irbis.kernels.blocks import from_arrow, tensor_bytes
from irbis.spark.columns import column
from irbis.spark.guard import on_executors

__all__ = ["tensor_bytes", "tensor_bytes_column", "tensor_bytes_of"]


def tensor_bytes_column(df: DataFrame, inputCol: str, outputCol: str,  # noqa: N803 (Spark's names)
                        dtype: str = "float32") -> DataFrame:
    """``df`` with ``outputCol``: the rows of ``inputCol`` as raw little-endian tensor bytes.

    Parameters
    ----------
    df : DataFrame
        The data; the other columns stay in the JVM.
    inputCol : str
        An ``array`` of numbers (nested arrays allowed; every row of one shape) or a Spark ML vector.
    outputCol : str
        The new ``binary`` column; a null row stays null.
    dtype : str
        ``float32`` (the default), ``float16`` or ``uint8`` (values in 0..255): the element type
        written, which the reading stage's ``inputDtype`` must name.

    Returns
    -------
    DataFrame

    Examples
    --------
    .. code-block:: python

        packed = tensor_bytes_column(df, "pixels", "pixels_bin")            # array<float> -> binary
        packed.select("id", "pixels_bin").write.parquet("images-bin.parquet")
        scorer = TorchModel(network="efficientnet_lite0", inputCol="pixels_bin", outputCol="logits",
                            inputShape=[3, 224, 224])
        scorer.transform(spark.read.parquet("images-bin.parquet"))
    """
    if inputCol not in df.columns:
        raise ValueError(f"tensor_bytes_column: no column {inputCol!r}; the columns are {df.columns}")
    return df.withColumn(outputCol, tensor_bytes_of(df, inputCol, dtype))


def tensor_bytes_of(df: DataFrame, inputCol: str, dtype: str = "float32") -> Any:  # noqa: N803 (Spark's names)
    """The column expression of :func:`tensor_bytes_column`: the rows of ``df``'s ``inputCol`` as tensor bytes."""
    if dtype not in TENSOR_DTYPES:
        raise ValueError(f"tensor_bytes_column: dtype {dtype!r} is not one of {list(TENSOR_DTYPES)}")
    found = df.schema[inputCol].dataType
    inner = found
    while isinstance(inner, ArrayType):
        inner = inner.elementType
    source = column(inputCol)
    if isinstance(found, VectorUDT):
        source = F.when(source.isNotNull(), vector_to_array(source, "float32"))
    elif not (isinstance(found, ArrayType) and isinstance(inner, NumericType)):
        raise TypeError(f"tensor_bytes_column: column {inputCol!r} has type {found.simpleString()}; "
                        f"expected an array of numbers or a Spark ML vector")
    return _packer(inputCol, dtype)(source)


def _packer(name: str, dtype: str) -> Any:
    """An iterator Arrow UDF writing each batch of rows as one buffer of tensor bytes."""
    from pyspark.sql.functions import arrow_udf

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            block = from_arrow(batch, name)
            yield tensor_bytes(block.values, block.valid, dtype)

    with warnings.catch_warnings():  # the eval type is given, not inferred from type hints
        warnings.simplefilter("ignore", UserWarning)
        return arrow_udf(on_executors(run), BinaryType(), PythonEvalType.SQL_SCALAR_ARROW_ITER_UDF)
