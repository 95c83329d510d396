"""The model behind a LIME stage, as a scoring function over perturbed inputs.

A model (a fitted stage or a ``PipelineModel``) runs inside the Spark task when every stage has a
kernel (:func:`irbis.ml.kernel_pipeline.stage_kernel`). ``EnsembleByKey`` is skipped: LIME scores single
inputs, and a row alone in its group keeps its value, so the stage is the identity per row. Any other
stage makes the model run as a Spark job per batch of perturbations instead (:func:`spark_score_fn`,
over :class:`irbis.ml.kernel_pipeline.SparkBatches`).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from irbis.errors import NoKernelError
from irbis.kernels.blocks import Tensor, run_steps
from irbis.kernels.sparkml_state import StageKernel
from irbis.ml.ensemble import EnsembleByKey
from irbis.ml.kernel_pipeline import SparkBatches, flatten, stage_kernel

__all__ = ["local_kernels", "local_score_fn", "spark_score_fn"]

LOG = logging.getLogger("irbis.explain")


def local_kernels(model: Any) -> tuple[list[StageKernel], list[str]]:
    """The kernels of the model's stages, and the names of the stages that have none."""
    kernels, missing = [], []
    for stage in flatten(model):
        if isinstance(stage, EnsembleByKey):
            continue
        try:
            kernels.append(stage_kernel(stage))
        except NoKernelError as err:
            missing.append(err.cls)
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
    """Score perturbed inputs with one Spark job per batch (for models without kernels).

    The batch is an array of images (S, H, W, C) or of rows (S, D); ``field`` is the input column's
    Spark field.
    """
    batches = SparkBatches(model, spark, [field], ordered=False)
    written = batches.columns()
    if target_col not in written:
        raise ValueError(f"the model does not produce targetCol {target_col!r}; it writes {written}")

    def score(batch: np.ndarray) -> np.ndarray:
        values = batches.run({field.name: list(batch)}, [target_col])[target_col]
        return np.array([np.asarray(v.toArray() if hasattr(v, "toArray") else [v], np.float64) for v in values])

    LOG.warning("LIME: the model has stages without a kernel; scoring each batch of "
                "perturbations as a Spark job on the driver (slower)")
    return score
