"""The model behind a LIME stage, as a scoring function over perturbed inputs.

A model (a fitted stage or a ``PipelineModel``) runs inside the Spark task when every stage has a
kernel (:func:`scoring_chain`, over :func:`irbis.ml.kernel_pipeline.model_chain`). ``EnsembleByKey`` is
skipped: LIME scores single inputs, and a row alone in its group keeps its value, so the stage is the
identity per row. Any other
stage makes the model run as a Spark job per batch of perturbations instead (:func:`spark_score_fn`,
over :class:`irbis.ml.kernel_pipeline.SparkBatches`).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from irbis.kernels.blocks import Tensor
from irbis.kernels.chain import KernelChain
from irbis.ml.ensemble import EnsembleByKey
from irbis.ml.kernel_pipeline import SparkBatches, model_chain

__all__ = ["local_score_fn", "scoring_chain", "spark_score_fn"]

LOG = logging.getLogger("irbis.explain")


def scoring_chain(model: Any) -> KernelChain:
    """The chain of the model's stages, ``EnsembleByKey`` left out; its ``missing`` are the stages that have
    no kernel."""
    return model_chain(model, skip=lambda stage: isinstance(stage, EnsembleByKey))


def check_target(chain: KernelChain, target_col: str) -> None:
    """The model must write ``target_col``; name what it writes otherwise."""
    if target_col not in chain.outputs:
        raise ValueError(f"the model does not produce targetCol {target_col!r}; it writes {chain.outputs}")


def target_values(block: Any, column: str) -> np.ndarray:
    """A target block (vectors or numbers, no nulls) as an (S, n) float array."""
    if isinstance(block, Tensor):
        if not block.valid.all():
            raise ValueError(f"the model gave a null {column!r} for a perturbed input")
        return np.asarray(block.values, np.float64).reshape(len(block.values), -1)
    values = np.asarray([np.nan if v is None else v for v in block], np.float64)
    return values.reshape(len(values), -1)


def local_score_fn(chain: KernelChain, input_col: str, target_col: str) -> Callable[[Any], np.ndarray]:
    """Score a block of perturbed ``input_col`` values through the chain's kernels; return ``target_col``."""
    check_target(chain, target_col)
    others = [c for c in chain.inputs if c != input_col]

    def score(block: Any) -> np.ndarray:
        if others:
            raise ValueError(f"the model reads column {others[0]!r}, which LIME does not have: "
                             f"it scores perturbed {input_col!r} values alone")
        blocks = chain.run({input_col: block})
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
