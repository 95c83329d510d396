"""What the stages ask of a DataFrame's columns: is a column an image struct, how long are its vectors.

One answer for every stage: an image column (:func:`irbis.spark.columns.is_image_struct`) is a struct
with every field of Spark's image schema (:data:`irbis.kernels.image.decode.IMAGE_FIELDS`, the fields the Arrow
blocks read), and a vector column's size comes from its ``ml_attr`` metadata when Spark ML wrote one.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from irbis.spark.columns import column, is_image_struct

__all__ = ["is_image_struct", "vector_size"]


def vector_size(df: DataFrame, col: str) -> int:
    """Size of the vectors of ``col``: from its ``ml_attr`` metadata, else from its first non-null row."""
    attrs = df.schema[col].metadata.get("ml_attr", {})
    if "num_attrs" in attrs:
        return int(attrs["num_attrs"])
    if "size" in attrs:
        return int(attrs["size"])
    first = df.where(column(col).isNotNull()).select(column(col)).first()
    return 0 if first is None else int(first[0].size)
