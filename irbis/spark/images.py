"""Read image files into a DataFrame: Spark's ``binaryFile`` source + OpenCV decoding in ``mapInArrow``.

The result has three columns: ``path``, ``image`` (Spark's image struct: origin, height, width,
nChannels, mode, data in BGR byte order, as Spark's own image source) and ``error`` (``None``, or why
the file could not be decoded).  Bad files never fail the job: their ``image`` is null and the
``error`` says why (or the row is dropped with ``dropInvalid=True``); every worker logs a count of
bad files, and an :class:`ImageReadStats` passed as ``stats`` counts them on the driver.

Examples
--------
>>> df = read_images("photos/", dropInvalid=True)              # doctest: +SKIP
>>> stream = read_images_stream("incoming/")                    # doctest: +SKIP
"""
from __future__ import annotations

import logging
import os
import random
import re
from typing import Any, Callable, Iterator
from urllib.parse import unquote

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from irbis.extras import require
from irbis.kernels.blocks import Images, bounded_slices, from_arrow, to_arrow
from irbis.kernels.image.decode import DEFAULT_MAX_PIXELS, decode_batch
from irbis.spark.guard import on_executors
from irbis.spark.resources import conf

__all__ = ["IMAGE_STRUCT", "ImageReadStats", "decode_frames", "read_images", "read_images_stream"]

_log = logging.getLogger(__name__)

#: Spark's image struct type (``struct<origin,height,width,nChannels,mode,data>``).
IMAGE_STRUCT = StructType([
    StructField("origin", StringType(), True), StructField("height", IntegerType(), False),
    StructField("width", IntegerType(), False), StructField("nChannels", IntegerType(), False),
    StructField("mode", IntegerType(), False), StructField("data", BinaryType(), False),
])  # the same as pyspark.ml.image.ImageSchema.imageSchema["image"], without needing a JVM
_BINARY_FILE_SCHEMA = StructType([
    StructField("path", StringType(), False), StructField("modificationTime", TimestampType(), False),
    StructField("length", LongType(), False), StructField("content", BinaryType(), True),
])
_READ_SCHEMA = StructType([StructField("path", StringType(), True),
                           StructField("image", IMAGE_STRUCT, True),
                           StructField("error", StringType(), True)])


class ImageReadStats:
    """Counts of files read and of bad files, kept in Spark accumulators.

    The counts grow as Spark runs the decoding: read them after an action. A DataFrame that is
    computed twice (two actions, no cache) counts its files twice.

    Examples
    --------
    >>> stats = ImageReadStats()                                # doctest: +SKIP
    >>> read_images("photos/", stats=stats).count()             # doctest: +SKIP
    >>> stats.bad_files, stats.files                            # doctest: +SKIP
    """

    def __init__(self, spark: SparkSession | None = None) -> None:
        from irbis.spark.session import active_session, require_classic

        spark = spark or active_session("ImageReadStats")
        require_classic(spark, "ImageReadStats", "accumulators")
        sc = spark.sparkContext
        self._files = sc.accumulator(0)
        self._bad = sc.accumulator(0)

    @property
    def files(self) -> int:
        """Files decoded (or tried) so far."""
        return int(self._files.value)

    @property
    def bad_files(self) -> int:
        """Files that could not be decoded so far."""
        return int(self._bad.value)

    def __repr__(self) -> str:
        return f"ImageReadStats(files={self.files}, bad_files={self.bad_files})"


def _quiet_opencv() -> None:
    # Decoding errors are reported per row; OpenCV's own stderr messages would only repeat them.
    import cv2
    import cv2.utils.logging as cv_logging

    cv_logging.setLogLevel(cv_logging.LOG_LEVEL_SILENT)
    cv2.setNumThreads(1)  # Spark already runs one task per core


def decode_frames(max_pixels: int | None, counters: tuple[Any, Any] | None = None,
                  max_bytes: int = 64 * 1024 * 1024) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Return a ``mapInArrow`` function: batches of (path, content) to batches of (path, image, error).

    The encoded bytes are read in place from the Arrow buffer and the decoded pixels are written
    once, into the output batch's buffer; output batches stay under ``max_bytes``.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    schema = pa.schema(list(to_arrow_type(_READ_SCHEMA)))

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        _quiet_opencv()
        for batch in batches:
            paths, contents = batch.column("path"), batch.column("content")

            def decode_slice(start: int, stop: int) -> Any:
                names = paths.slice(start, stop - start)
                images, errors = decode_batch(from_arrow(contents.slice(start, stop - start)), max_pixels)
                _count_bad(names.to_pylist(), errors, counters)
                block = Images.from_arrays(images, names.to_numpy(zero_copy_only=False))
                return pa.RecordBatch.from_arrays(
                    [names, to_arrow(block, schema.field("image").type), pa.array(errors, pa.string())],
                    schema=schema)

            yield from bounded_slices(batch.num_rows, decode_slice, max_bytes)

    return run


def _count_bad(paths: list[str], errors: list[str | None], counters: tuple[Any, Any] | None) -> None:
    bad = [(p, e) for p, e in zip(paths, errors) if e is not None]
    if bad:
        _log.warning("read_images: %d of %d files could not be decoded, e.g. %s: %s",
                     len(bad), len(paths), bad[0][0], bad[0][1])
    if counters is not None:
        counters[0].add(len(paths))
        counters[1].add(len(bad))


def _binary_reader(spark: SparkSession, recursive: bool, path_glob_filter: str | None) -> DataFrameReader:
    reader = spark.read.format("binaryFile").option("recursiveFileLookup", str(recursive).lower())
    return reader.option("pathGlobFilter", path_glob_filter) if path_glob_filter else reader


def read_images(path: str | list[str], recursive: bool = True, sampleRatio: float = 1.0,
                dropInvalid: bool = False, spark: SparkSession | None = None, *,
                maxPixels: int | None = DEFAULT_MAX_PIXELS, pathGlobFilter: str | None = None,
                seed: int = 0, stats: ImageReadStats | None = None) -> DataFrame:
    """Read image files as a DataFrame of ``path``, ``image`` (Spark's image struct) and ``error``.

    Parameters
    ----------
    path : str or list of str
        Files or folders, any filesystem Spark reads (local, HDFS, S3, ...).
    recursive : bool
        Look into sub-folders.
    sampleRatio : float
        Keep this fraction of the files, chosen at random (``seed``) from the listing *before*
        any file content is read.
    dropInvalid : bool
        Drop files that cannot be decoded instead of returning them with a null image.
    spark : SparkSession, optional
        The session; the active one by default.
    maxPixels : int or None
        Refuse images with more pixels than this (checked in the header, before decoding).
    pathGlobFilter : str, optional
        Only read file names matching this glob, e.g. ``"*.jpg"``.
    seed : int
        Seed of the sampling.
    stats : ImageReadStats, optional
        Counters of files and bad files, filled as Spark runs.

    Returns
    -------
    pyspark.sql.DataFrame
        Columns ``path`` (str), ``image`` (struct, null for bad files), ``error`` (str or null).

    Notes
    -----
    Spark's file scan silently skips zero-byte files, so ``read_images`` runs one small job that
    lists the scanned paths (no file content is read) to report them as bad files; with
    ``dropInvalid=True`` and no ``stats`` it skips that job.

    Raises
    ------
    irbis.errors.MissingExtraError
        When OpenCV, which decodes the images, is not installed (``pip install 'irbis[images]'``).
    """
    require("read_images", ["images"])
    if not 0.0 < sampleRatio <= 1.0:
        raise ValueError(f"sampleRatio must be in (0, 1], found {sampleRatio}")
    from irbis.spark.session import active_session

    spark = spark or active_session("read_images")
    paths = [path] if isinstance(path, str) else list(path)
    require_local_paths(spark, paths, "read_images")
    listing = _binary_reader(spark, recursive, pathGlobFilter).load(paths)
    files = [_norm(p) for p in listing.inputFiles()]  # Spark's own listing, empty files included
    if sampleRatio < 1.0:
        # Sample the listing on the driver, then read only the chosen files' content.
        files = [p for p in sorted(files) if random.Random(f"{seed}:{p}").random() < sampleRatio]
        if not files:
            return spark.createDataFrame([], _READ_SCHEMA)
        listing = _binary_reader(spark, False, None).load(files)
    empty = _zero_byte_files(listing, files) if not dropInvalid or stats is not None else []
    counters = (stats._files, stats._bad) if stats is not None else None
    out = listing.select("path", "content").mapInArrow(on_executors(decode_frames(maxPixels, counters)),
                                                        _READ_SCHEMA)
    if stats is not None:
        stats._files.add(len(empty))
        stats._bad.add(len(empty))
    if dropInvalid:
        return out.filter(out.error.isNull())
    if empty:
        rows = [(p, None, "empty file (0 bytes): not an image") for p in empty]
        out = out.unionByName(spark.createDataFrame(rows, _READ_SCHEMA))
    return out


def require_local_paths(spark: SparkSession, paths: list[str], caller: str) -> None:
    """Raise FileNotFoundError for a path of the local filesystem that does not exist.

    Spark reports a missing path too, but only after logging a JVM stack trace at WARN level (its check
    for a streaming sink's metadata folder); a local path is checked here first, where the driver lists
    it as Spark would. Paths of other filesystems, and glob patterns, are left to Spark.
    """
    default_fs = conf(spark, "spark.hadoop.fs.defaultFS", "file:///") or "file:///"
    for p in paths:
        scheme = re.match(r"^([A-Za-z][\w+.-]*):", p)
        local = p.startswith("file:") if scheme else default_fs.startswith("file:")
        plain = re.sub(r"^file:(//)?", "", p) if scheme else p
        if local and not any(c in plain for c in "*?[{") and not os.path.exists(plain):
            raise FileNotFoundError(f"{caller}: path {p!r} does not exist (looked for {os.path.abspath(plain)!r} "
                                    "on the driver's local filesystem)")


def _zero_byte_files(listing: DataFrame, files: list[str]) -> list[str]:
    """The listed files that Spark's file scan skips for being empty (a job that reads no content)."""
    scanned = {r.path for r in listing.select("path").collect()}
    empty = [p for p in files if p not in scanned]
    if empty:
        _log.warning("read_images: %d empty files (0 bytes), e.g. %s", len(empty), empty[0])
    return empty


def _norm(path: str) -> str:
    # inputFiles() gives URIs ("file:///a%20b.jpg"); the scan's path column says "file:/a b.jpg".
    return unquote(re.sub(r"^([A-Za-z][\w+.-]*):///", r"\1:/", path))


def read_images_stream(path: str, recursive: bool = True, dropInvalid: bool = False,
                       spark: SparkSession | None = None, *,
                       maxPixels: int | None = DEFAULT_MAX_PIXELS, pathGlobFilter: str | None = None,
                       maxFilesPerTrigger: int | None = None) -> DataFrame:
    """Watch a folder as a Structured Streaming source of decoded images.

    New files in ``path`` become rows of ``path``, ``image``, ``error`` as in :func:`read_images`.
    ``maxFilesPerTrigger`` bounds each micro-batch; without OpenCV (``pip install 'irbis[images]'``) it
    raises :class:`irbis.errors.MissingExtraError`.
    """
    from irbis.spark.session import active_session

    require("read_images_stream", ["images"])
    spark = spark or active_session("read_images_stream")
    reader = (spark.readStream.format("binaryFile").schema(_BINARY_FILE_SCHEMA)
              .option("recursiveFileLookup", str(recursive).lower()))
    if pathGlobFilter:
        reader = reader.option("pathGlobFilter", pathGlobFilter)
    if maxFilesPerTrigger:
        reader = reader.option("maxFilesPerTrigger", int(maxFilesPerTrigger))
    files = reader.load(path).select("path", "content")
    out = files.mapInArrow(on_executors(decode_frames(maxPixels)), _READ_SCHEMA)
    return out.filter(out.error.isNull()) if dropInvalid else out
