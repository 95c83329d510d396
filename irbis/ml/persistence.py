"""Persistence of Irbis stages: Spark ML metadata (JSON Params) plus sidecar files.

Every stage saves the way PySpark's own Python stages do (``<path>/metadata`` holds the class, uid and
the JSON Params), so a ``Pipeline`` or ``PipelineModel`` that mixes Irbis stages with SparkML's JVM
stages saves and loads as one. State that is not a Param (network weights, fitted vocabularies) goes
into sidecar files that the stage itself writes into a local folder through ``_save_extra`` and reads
back through ``_load_extra``. No Python object is ever pickled into a saved stage.

Where the sidecar files live depends on the path:

* a plain local path (``/models/m``): the files are written as they are into ``<path>/data``;
* a URI (``file:``, ``hdfs://``, ``s3a://``, ``abfss://``, ...): the files travel through Spark's
  own data source writer, which uses Hadoop's FileSystem API, as a Parquet table of
  ``(file, part, bytes)`` rows in ``<path>/data``. Any storage Spark can write works, on a classic
  or a Spark Connect session, and on a cluster the executors write it. Loading brings the files
  into a local folder first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Generic, TypeVar, cast
from urllib.parse import urlparse

from pyspark.ml.param import Params
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from irbis.kernels.sparkml.state import read_metadata

S = TypeVar("S", bound="IrbisPersistable")


#: Bytes per row of a sidecar file written through Spark (large weight files span several rows).
PART_BYTES = 8 * 1024 * 1024
#: Metadata key telling a loader that the sidecar files went through Spark.
_THROUGH_SPARK = "irbisSidecarTable"


def is_local_path(path: str) -> bool:
    """Whether ``path`` is a plain local path (no URI scheme) written with plain file I/O."""
    return urlparse(path).scheme == "" or (len(path) > 1 and path[1] == ":")  # C:\ on Windows


def write_files(spark: Any, folder: str, uri: str) -> None:
    """Write every file under the local ``folder`` to ``uri`` through Spark (a Parquet table)."""
    rows = []
    for file in sorted(Path(folder).rglob("*")):
        if file.is_file():
            data, name = file.read_bytes(), file.relative_to(folder).as_posix()
            parts = range(0, max(len(data), 1), PART_BYTES)
            rows += [(name, i, data[start:start + PART_BYTES]) for i, start in enumerate(parts)]
    schema = "file string, part int, bytes binary"
    spark.createDataFrame(rows, schema).coalesce(1).write.mode("overwrite").parquet(uri)


def read_files(spark: Any, uri: str) -> str:
    """Bring the files that :func:`write_files` wrote to ``uri`` into a new local folder."""
    folder = Path(tempfile.mkdtemp(prefix="irbis-load-"))
    parts: dict[str, list[tuple[int, bytes]]] = {}
    for row in spark.read.parquet(uri).collect():
        parts.setdefault(row.file, []).append((row.part, bytes(row.bytes)))
    for name, chunks in parts.items():
        target = folder / name
        if not target.resolve().is_relative_to(folder.resolve()):
            raise ValueError(f"{uri} names a file outside its folder: {name!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"".join(data for _, data in sorted(chunks)))
    return str(folder)


def save_network_files(source: dict[str, Any], folder: str, summary: list[Any] | None) -> None:
    """Into a saved stage's ``folder``: the network file or folder of ``source`` (a resolved model source;
    a repository model has no file to copy) as ``network*``, and the training ``summary`` as
    ``summary.json`` when there is one."""
    import json
    import shutil

    if "path" in source:
        src = Path(source["path"])
        if src.is_dir():
            shutil.copytree(src, Path(folder) / "network")
        else:
            shutil.copy2(src, Path(folder) / f"network{src.suffix}")
    if summary is not None:
        (Path(folder) / "summary.json").write_text(json.dumps(summary))


def load_network_files(folder: str) -> tuple[str | None, list[Any] | None]:
    """What :func:`save_network_files` wrote: the saved network's path (None when there is none) and the
    training summary (None when there is none)."""
    import json

    saved = sorted(Path(folder).glob("network*"))
    summary = Path(folder) / "summary.json"
    return (str(saved[0]) if saved else None), (json.loads(summary.read_text()) if summary.exists() else None)


def remove_folder(spark: Any, path: str, caller: str) -> None:
    """Remove the folder ``path`` and what it holds, if it exists, on any storage Spark writes (through Spark's
    Hadoop FileSystem, as PySpark's ``overwrite().save()`` does). A Spark Connect client cannot reach that file
    system: there a local folder is removed here, and another path names what to do (``caller`` says who
    asked)."""
    from irbis.spark.session import is_connect

    if not is_connect(spark):
        writer = MLWriter()
        writer.session(spark)
        MLWriter._handleOverwrite(writer, path)
    elif is_local_path(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        raise ValueError(f"{caller} on Spark Connect removes local folders only: remove {path} first, then "
                         "run again")


class IrbisWriter(MLWriter):
    """Writes the JSON metadata, then lets the stage write its sidecar files (see the module doc)."""

    def __init__(self, instance: "IrbisPersistable") -> None:
        super().__init__()
        self.instance = instance

    def _handleOverwrite(self, path: str) -> None:  # noqa: N802 (PySpark's name)
        """Remove what ``path`` holds before ``overwrite().save(path)``. PySpark's own way goes through the
        JVM's file system, which a Spark Connect client cannot reach: there a local folder is removed here (the
        client writes a stage's local sidecar files itself), and another path names what to do."""
        remove_folder(self.sparkSession, path, "overwrite()")

    def saveImpl(self, path: str) -> None:  # noqa: N802 (PySpark's name)
        extra = self.instance._has_extra()
        through_spark = extra and not is_local_path(path)
        DefaultParamsWriter.saveMetadata(cast(Params, self.instance), path, self.sparkSession,
                                         extraMetadata={_THROUGH_SPARK: through_spark})
        if not extra:
            return
        if not through_spark:
            data_dir = os.path.join(path, "data")
            os.makedirs(data_dir, exist_ok=True)
            self.instance._save_extra(data_dir)
            return
        with tempfile.TemporaryDirectory(prefix="irbis-save-") as folder:
            self.instance._save_extra(folder)
            write_files(self.sparkSession, folder, path.rstrip("/") + "/data")


class IrbisReader(MLReader[S], Generic[S]):
    """Reads what :class:`IrbisWriter` wrote, building the class named in the metadata.

    :meth:`load` reads through Spark (any URI); :meth:`local` reads a local folder with no Spark at all
    (what :func:`irbis.ml.load_local` and the HTTP server use). Both build the stage the same way: the
    class check, the Params, the sidecar files and the sidecar Params.
    """

    def __init__(self, cls: type[S]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> S:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        return self._build(metadata, path)

    def local(self, path: str, metadata: dict[str, Any] | None = None) -> S:
        """The stage saved in the local folder ``path``, read without a SparkSession."""
        metadata = metadata or read_metadata(path)
        if metadata.get(_THROUGH_SPARK):
            raise ValueError(f"{metadata['class']} {metadata['uid']} in {path!r}: its files were saved through "
                             "Spark (a URI path); load it with load(), or save it to a local folder")
        return self._build(metadata, path)

    def _build(self, metadata: dict[str, Any], path: str) -> S:
        module_name, _, class_name = metadata["class"].rpartition(".")
        module = __import__(module_name, fromlist=[class_name])
        py_type = getattr(module, class_name)
        if not issubclass(py_type, self.cls):
            raise TypeError(
                f"{path!r} holds a saved {metadata['class']}, which is not a {self.cls.__name__}; "
                f"load it with {class_name}.load."
            )
        instance = py_type()
        instance._resetUid(metadata["uid"])
        restored = [n for n in instance._sidecar_params() if n in metadata["paramMap"]]
        DefaultParamsReader.getAndSetParams(instance, metadata, skipParams=restored)
        data = self._data_folder(metadata, path)
        if data is not None:
            instance._load_extra(data)
        for name in restored:  # not restored from the sidecar files (a stage saved without them): as saved
            if not instance.isSet(name):
                instance.set(instance.getParam(name), metadata["paramMap"][name])
        return instance

    def _data_folder(self, metadata: dict[str, Any], path: str) -> str | None:
        """The local folder of the stage's sidecar files (brought from ``path`` through Spark if need be)."""
        if metadata.get(_THROUGH_SPARK):
            return read_files(self.sparkSession, path.rstrip("/") + "/data")
        local = urlparse(path).path if urlparse(path).scheme == "file" else path
        if (is_local_path(path) or local != path) and os.path.isdir(os.path.join(local, "data")):
            return os.path.join(local, "data")
        return None


def load_local_stage(path: str) -> Any:
    """The Irbis stage saved in the local folder ``path``, read without Spark by its class's reader."""
    metadata = read_metadata(path)
    module_name, _, class_name = metadata["class"].rpartition(".")
    reader = getattr(__import__(module_name, fromlist=[class_name]), class_name).read()
    if not hasattr(reader, "local"):
        raise TypeError(f"{metadata['class']} in {path!r} cannot be read without Spark")
    return reader.local(path, metadata)


class IrbisPersistable(MLWritable, MLReadable):
    """Mixin giving a stage ``save``/``load`` with optional sidecar files."""

    def write(self) -> MLWriter:
        """Return a writer that saves the Params and the sidecar files."""
        return IrbisWriter(self)

    @classmethod
    def read(cls) -> IrbisReader[Any]:
        """Return a reader for this class."""
        return IrbisReader(cls)

    def _has_extra(self) -> bool:
        """Whether ``_save_extra`` has anything to write; stages with sidecar state override it."""
        return type(self)._save_extra is not IrbisPersistable._save_extra

    def _sidecar_params(self) -> tuple[str, ...]:
        """Params whose saved value names a local file that ``_load_extra`` points at its saved copy
        instead; they are set from the metadata only when ``_load_extra`` did not set them."""
        return ()

    def _save_extra(self, path: str) -> None:
        """Write state that is not a Param into the local directory ``path``."""

    def _load_extra(self, path: str) -> None:
        """Read back what ``_save_extra`` wrote into ``path``."""
