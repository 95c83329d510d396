"""Persistence of Irbis stages: Spark ML metadata (JSON Params) plus sidecar files.

Every stage saves the way PySpark's own Python stages do (``<path>/metadata`` holds the class, uid and
the JSON Params), so a ``Pipeline`` or ``PipelineModel`` that mixes Irbis stages with SparkML's JVM
stages saves and loads as one. State that is not a Param (network weights, fitted vocabularies) goes
into sidecar files that the stage itself writes into ``<path>/data`` through ``_save_extra`` and
reads back through ``_load_extra``. No Python object is ever pickled into a saved stage.
"""

from __future__ import annotations

import os
from typing import Any, Generic, TypeVar
from urllib.parse import urlparse

from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

S = TypeVar("S", bound="IrbisPersistable")


def local_dir(path: str) -> str:
    """Map a save path to a local directory for sidecar files.

    Sidecar files are written with plain file I/O, so the path must be on a local (or mounted)
    filesystem; ``file:`` URIs are accepted.
    """
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return parsed.path if parsed.scheme == "file" else path
    raise ValueError(
        f"Irbis stages with sidecar files save to local or mounted paths; got {path!r} "
        f"(scheme {parsed.scheme!r}). Save to a local path and copy it with your storage tools."
    )


class IrbisWriter(MLWriter):
    """Writes the JSON metadata, then lets the stage write its sidecar files into ``<path>/data``."""

    def __init__(self, instance: "IrbisPersistable") -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:  # noqa: N802 (PySpark's name)
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession)
        data_dir = os.path.join(local_dir(path), "data")
        if self.instance._has_extra():
            os.makedirs(data_dir, exist_ok=True)
            self.instance._save_extra(data_dir)


class IrbisReader(MLReader[S], Generic[S]):
    """Reads what :class:`IrbisWriter` wrote, building the class named in the metadata."""

    def __init__(self, cls: type[S]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> S:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
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
        DefaultParamsReader.getAndSetParams(instance, metadata)
        data_dir = os.path.join(local_dir(path), "data")
        if os.path.isdir(data_dir):
            instance._load_extra(data_dir)
        return instance


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

    def _save_extra(self, path: str) -> None:
        """Write state that is not a Param into the local directory ``path``."""

    def _load_extra(self, path: str) -> None:
        """Read back what ``_save_extra`` wrote into ``path``."""
