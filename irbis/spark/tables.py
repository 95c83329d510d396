"""Tables of texts or vectors read through Spark: a Parquet or CSV file (or folder of them), or a folder of
``.txt`` files (one text per file). ``irbis embed``, ``irbis explain`` and :func:`irbis.score` read them alike."""

from __future__ import annotations

from typing import Any

#: The kinds of table :func:`read_table` reads, and the file name ending of each.
TABLE_ENDINGS = {"parquet": ".parquet", "csv": ".csv", "text": ".txt"}


def table_kind(source: str) -> str:
    """The kind of table ``source`` names by its ending: ``parquet``, ``csv``, else ``text`` (a folder of
    ``.txt`` files)."""
    lower = source.rstrip("/").lower()
    return next((kind for kind in ("parquet", "csv") if lower.endswith(TABLE_ENDINGS[kind])), "text")


def read_table(spark: Any, source: str | list[str], kind: str, column: str = "text", *, schema: Any = None,
               base_path: str | None = None) -> Any:
    """The rows of ``source`` (a path, or a list of files) of ``kind`` (see :func:`table_kind`).

    A CSV file has a header and may hold multi-line quoted texts; its column types are inferred unless
    ``schema`` (a ``StructType``, which Parquet takes too) gives them. A folder of ``.txt`` files gives one
    row per file: its ``path`` and its bytes as ``column`` (a file that is not UTF-8 can then be named).
    ``base_path`` is the folder whose ``key=value`` sub-folders are partition columns, when ``source``
    lists files inside them.
    """
    paths = [source] if isinstance(source, str) else list(source)
    reader = spark.read if schema is None or kind == "text" else spark.read.schema(schema)
    if base_path is not None:
        reader = reader.option("basePath", base_path)
    if kind == "parquet":
        return reader.parquet(*paths)
    if kind == "csv":
        reader = reader.option("header", True).option("multiLine", True).option("escape", '"')
        return (reader if schema is not None else reader.option("inferSchema", True)).csv(paths)
    if kind != "text":
        raise ValueError(f"a table is parquet, csv or text (a folder of .txt files), not {kind!r}")
    return (reader.format("binaryFile").option("pathGlobFilter", "*.txt").load(paths)
            .selectExpr("path", f"content as `{column}`"))
