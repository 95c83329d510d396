"""The model behind a LIME stage, as a scoring function over perturbed inputs.

A model (a fitted stage or a ``PipelineModel``) runs inside the Spark task when every stage has a
batch kernel: Irbis block-kernel stages (:func:`irbis.ml.fuse.fusable`) and the SparkML stages of
:data:`irbis.kernels.sparkml.SPARKML_KERNELS`. ``EnsembleByKey`` is skipped: LIME scores single
inputs, and a row alone in its group keeps its value, so the stage is the identity per row. Any
other stage makes the model run as a Spark job per batch of perturbations instead
(:func:`spark_score_fn`).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
from pyspark.ml import PipelineModel

from irbis.kernels.blocks import Tensor, run_steps
from irbis.kernels.sparkml import StageKernel, sparkml_kernel
from irbis.ml.ensemble import EnsembleByKey
from irbis.ml.fuse import fusable

__all__ = ["local_kernels", "local_score_fn", "spark_score_fn"]

LOG = logging.getLogger("irbis.explain")


def _flatten(model: Any) -> list[Any]:
    if isinstance(model, PipelineModel):
        return [s for stage in model.stages for s in _flatten(stage)]
    return [model]


def local_kernels(model: Any) -> tuple[list[StageKernel], list[str]]:
    """The kernels of the model's stages, and the names of the stages that have none."""
    kernels, missing = [], []
    for stage in _flatten(model):
        if isinstance(stage, EnsembleByKey):
            continue
        kernel = sparkml_kernel(stage)
        if kernel is None and fusable(stage):
            kernel = StageKernel(stage._input_columns(), [n for n, _ in stage._output_columns()],
                                 stage._make_batch_fn())
        if kernel is None:
            missing.append(type(stage).__name__)
        else:
            kernels.append(kernel)
    return kernels, missing


def check_target(kernels: list[StageKernel], target_col: str) -> None:
    """The model must write ``target_col``; name what it writes otherwise."""
    produced = [c for k in kernels for c in k.outputs]
    if target_col not in produced:
        raise ValueError(f"the model does not produce targetCol {target_col!r}; it writes {produced}")


def target_values(block: Any, column: str) -> np.ndarray:
    """A target block (vectors or numbers, no nulls) as an (S, n) float array."""
    if isinstance(block, Tensor):
        if not block.valid.all():
            raise ValueError(f"the model gave a null {column!r} for a perturbed input")
        return np.asarray(block.values, np.float64).reshape(len(block.values), -1)
    values = np.asarray([np.nan if v is None else v for v in block], np.float64)
    return values.reshape(len(values), -1)


def local_score_fn(kernels: list[StageKernel], input_col: str,
                   target_col: str) -> Callable[[Any], np.ndarray]:
    """Score a block of perturbed ``input_col`` values through the kernels; return ``target_col``."""
    check_target(kernels, target_col)

    def score(block: Any) -> np.ndarray:
        available = {input_col}
        for kernel in kernels:
            missing = [c for c in kernel.inputs if c not in available]
            if missing:
                raise ValueError(f"the model reads column {missing[0]!r}, which LIME does not have: "
                                 f"it scores perturbed {input_col!r} values alone")
            available |= set(kernel.outputs)
        blocks = run_steps([(k.inputs, k.fn) for k in kernels], {input_col: block})
        return target_values(blocks[target_col], target_col)

    return score


def spark_score_fn(model: Any, spark: Any, input_col: str, field: Any,
                   target_col: str) -> Callable[[np.ndarray], np.ndarray]:
    """Score perturbed inputs with one Spark job per batch (for models without pandas kernels).

    The batch is an array of images (S, H, W, C) or of rows (S, D); ``field`` is the input column's
    Spark field.
    """
    from pyspark.ml.linalg import Vectors
    from pyspark.sql.types import StructType

    from irbis.kernels.image import array_to_struct

    def score(batch: np.ndarray) -> np.ndarray:
        if batch.ndim == 4:
            rows = [(array_to_struct(img, ""),) for img in batch]
        else:
            rows = [(Vectors.dense(v),) for v in np.asarray(batch, np.float64)]
        frame = spark.createDataFrame(rows, StructType([field]))
        out = model.transform(frame)
        if target_col not in out.columns:
            raise ValueError(f"the model does not produce targetCol {target_col!r}; it writes {out.columns}")
        return np.array([np.asarray(r[0].toArray() if hasattr(r[0], "toArray") else [r[0]], np.float64)
                         for r in out.select(target_col).collect()])

    LOG.warning("LIME: the model has stages without a pandas kernel; scoring each batch of "
                "perturbations as a Spark job on the driver (slower)")
    return score
