"""Fusing consecutive Irbis stages of a pipeline into one pass over each Arrow batch.

In a ``PipelineModel`` every Irbis stage is one Python UDF: an ``ImageTransformer`` followed by a
``TorchModel`` sends the images to Python, the transformed pixels back to the JVM, and the same pixels
to Python again. :func:`fuse` replaces each run of consecutive block-kernel stages with one
:class:`FusedStages`, whose kernel runs the stages' kernels one after another on the same numpy blocks (a
:class:`~irbis.kernels.chain.KernelChain`).
Columns that only feed a later stage of the run are not sent back to the JVM at all (list them in
``keep`` to have them anyway).

Examples
--------
>>> fast = fuse(pipeline_model)                           # doctest: +SKIP
>>> fast.transform(images).select("path", "logits")       # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Iterable

from pyspark.ml import PipelineModel, Transformer
from pyspark.ml.param import TypeConverters
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter
from pyspark.sql.types import DataType, StructType

from irbis.kernels.blocks import BatchFn
from irbis.kernels.chain import ChainKernel, KernelChain
from irbis.ml.base import IrbisTransformer, _StageMixin
from irbis.ml.params import param_mixin
from irbis.ml.persistence import load_local_stage

__all__ = ["FusedStages", "fuse"]


def fusable(stage: Any) -> bool:
    """Whether ``stage`` is an Irbis stage that answers :meth:`~irbis.ml.base._StageMixin.kernel`."""
    return isinstance(stage, _StageMixin) and stage.has_kernel()


_FusedStagesParams: Any = param_mixin("keep", "intermediate columns to return anyway",
                                  TypeConverters.toListString, [])


class FusedStages(IrbisTransformer, _FusedStagesParams):
    """Several Irbis stages run as one Python pass per Arrow batch (see :func:`fuse`).

    Parameters
    ----------
    keep : list of str
        Intermediate columns to return although only the fused stages read them.
    """

    def _init_state(self) -> None:
        self.stages: list[Any] = []

    def setStages(self, stages: Iterable[Any]) -> "FusedStages":  # noqa: N802
        """Set the stages to fuse; each must be a block-kernel Irbis stage (see :func:`fusable`)."""
        stages = list(stages)
        bad = [type(s).__name__ for s in stages if not fusable(s)]
        if bad:
            raise TypeError(f"FusedStages: {bad} cannot be fused; only Irbis stages with a block "
                            f"kernel can (e.g. ImageTransformer, TorchModel, ImageFeaturizer)")
        self.stages = stages
        return self

    def _chain(self) -> KernelChain:
        """The fused stages' columns as a chain (no kernels built)."""
        return KernelChain([s.columns() for s in self.stages])

    def _input_columns(self) -> list[str]:
        return list(self._chain().inputs)

    def _output_columns(self) -> list[tuple[str, DataType]]:
        chain = self._chain()
        internal = chain.consumed - set(self.getOrDefault(self.keep))
        return [(n, chain.types[n]) for n in chain.outputs if n not in internal]

    def _validate_schema(self, schema: StructType) -> None:
        for stage in self.stages:
            schema = stage.transform_schema(schema)

    def _input_kinds(self) -> dict[str, frozenset[str]]:
        return dict(self._chain().inputs)

    def _make_batch_fn(self) -> BatchFn:
        return ChainKernel.of(KernelChain([s.kernel() for s in self.stages]), [n for n, _ in self._output_columns()])

    def write(self) -> MLWriter:
        """A writer that saves the Params and each fused stage under ``<path>/stages``, as a
        ``PipelineModel`` does: through Spark, so any storage Spark can write works."""
        return _FusedWriter(self)

    @classmethod
    def read(cls) -> Any:
        """A reader for what :meth:`write` saved."""
        return _FusedReader(cls)


def _stage_path(path: str, index: int, uid: str) -> str:
    return f"{path.rstrip('/')}/stages/{index:03d}_{uid}"


class _FusedWriter(MLWriter):
    def __init__(self, instance: FusedStages) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:  # noqa: N802 (PySpark's name)
        uids = [s.uid for s in self.instance.stages]
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata={"stageUids": uids})
        for i, stage in enumerate(self.instance.stages):
            stage.write().session(self.sparkSession).save(_stage_path(path, i, stage.uid))


class _FusedReader(MLReader[Any]):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> FusedStages:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        return _fused(metadata, [DefaultParamsReader.loadParamsInstance(_stage_path(path, i, uid), self.sparkSession)
                                 for i, uid in enumerate(metadata["stageUids"])])

    def local(self, path: str, metadata: dict[str, Any]) -> FusedStages:
        """The stages saved in the local folder ``path``, read without Spark."""
        return _fused(metadata, [load_local_stage(_stage_path(path, i, uid))
                                 for i, uid in enumerate(metadata["stageUids"])])


def _fused(metadata: dict[str, Any], stages: list[Any]) -> FusedStages:
    fused = FusedStages()
    fused._resetUid(metadata["uid"])
    DefaultParamsReader.getAndSetParams(fused, metadata)
    fused.stages = stages
    return fused


def _columns_read(stage: Any) -> set[str]:
    """Every string (or list of strings) Param value of a stage: the columns it may read."""
    names: set[str] = set()
    for param, value in stage.extractParamMap().items():
        if isinstance(value, str):
            names.add(value)
        elif isinstance(value, (list, tuple)):
            names |= {v for v in value if isinstance(v, str)}
    return names


def fuse(model: PipelineModel | list[Transformer], keep: Iterable[str] = ()) -> PipelineModel:
    """Return a ``PipelineModel`` whose consecutive block-kernel Irbis stages run as one pass.

    Parameters
    ----------
    model : PipelineModel or list of stages
        A fitted pipeline. Stages that cannot be fused (SparkML's, Irbis stages working in SQL) stay
        as they are, in order.
    keep : iterable of str
        Intermediate columns to return although only fused stages read them. Intermediate columns
        that a later, unfused stage reads (by any Param) are always kept.

    Returns
    -------
    PipelineModel
        The same transformation; intermediate columns that nothing else reads are left out.
    """
    stages = list(model.stages if isinstance(model, PipelineModel) else model)
    keep = set(keep)
    result: list[Transformer] = []
    i = 0
    while i < len(stages):
        j = i
        while j < len(stages) and fusable(stages[j]):
            j += 1
        if j - i >= 2:
            later = set().union(*(_columns_read(s) for s in stages[j:])) if j < len(stages) else set()
            result.append(FusedStages(keep=sorted(keep | later)).setStages(stages[i:j]))
            i = j
        else:
            result.append(stages[i])
            i += 1
    return PipelineModel(result)
