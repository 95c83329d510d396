"""Column names as Spark reads them: every name a user gives is quoted before Spark parses it.

Spark parses the names given to ``F.col``, ``select``, ``groupBy`` and SQL text: ``"a.b"`` would be field
``b`` of a struct ``a``, and ``"c d"`` or a name holding a backtick would not parse. :func:`quote` makes
any name one identifier; :func:`column` is the column of that exact name.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, NumericType, StructType

from irbis.kernels.image.decode import IMAGE_FIELDS


def quote(name: str) -> str:
    """``name`` as one SQL identifier: in backticks, each backtick doubled.

    Examples
    --------
    >>> quote("a.b"), quote("x`y")
    ('`a.b`', '`x``y`')
    """
    return "`" + name.replace("`", "``") + "`"


def column(name: str) -> Column:
    """The top-level column called exactly ``name`` (dots, spaces and backticks included)."""
    return F.col(quote(name))


def is_image_struct(dtype: DataType) -> bool:
    """Whether ``dtype`` is an image struct: a struct holding every field of Spark's image schema
    (:data:`irbis.kernels.image.decode.IMAGE_FIELDS`, the fields the Arrow blocks read)."""
    return isinstance(dtype, StructType) and not set(IMAGE_FIELDS) - set(dtype.names)


def steps_of_features(dtype: DataType) -> bool:
    """Whether ``dtype`` is ``array<array<number>>``: a sequence of steps of features (a burst's frame
    features, a sensor's readings), their number free to vary per row."""
    return (isinstance(dtype, ArrayType) and isinstance(dtype.elementType, ArrayType)
            and isinstance(dtype.elementType.elementType, NumericType))


__all__ = ["column", "is_image_struct", "quote", "steps_of_features"]
