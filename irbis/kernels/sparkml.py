"""Fitted SparkML stages as pure batch kernels, so that a pipeline runs without a Spark job.

SparkML's fitted models compute in the JVM. Some are small enough to run from their public fitted
state: :data:`SPARKML_KERNELS` maps a stage's class name to a builder that reads the stage's public
Params and attributes (``coefficientMatrix``, ``interceptVector``, ``getFeaturesCol()``, ...) and
returns a :class:`StageKernel`, a :data:`~irbis.kernels.blocks.BatchFn` over column blocks. Explanations
(LIME) use it to score perturbed inputs inside a Spark task; any runtime that needs a fitted SparkML
pipeline without a Spark job (e.g. serving) can use the same registry. The module imports no
``pyspark``: builders only read attributes of the stage they are given.

Examples
--------
>>> kernel = sparkml_kernel(lr_model)                               # doctest: +SKIP
>>> kernel.fn({"features": Tensor(x, valid)})["probability"].values  # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from irbis.kernels.blocks import BatchFn, Tensor

__all__ = ["SPARKML_KERNELS", "StageKernel", "assemble_vectors", "logistic_regression", "sparkml_kernel"]


@dataclass
class StageKernel:
    """A stage as a kernel: the columns it reads, the columns it writes, and its batch function."""

    inputs: list[str]
    outputs: list[str]
    fn: BatchFn


# -- math -----------------------------------------------------------------------------------------
def logistic_regression(x: np.ndarray, coefficients: np.ndarray, intercepts: np.ndarray,
                        threshold: float = 0.5,
                        thresholds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SparkML's ``LogisticRegressionModel`` on rows ``x`` (N, D): raw scores, probabilities, predictions.

    ``coefficients`` is SparkML's ``coefficientMatrix`` (1 × D for a binomial model, K × D for a
    multinomial one) and ``intercepts`` its ``interceptVector``. A binomial model's raw score is
    ``[-m, m]`` for the margin ``m`` and its prediction is 1 when ``m`` exceeds the threshold's logit;
    a multinomial model's probabilities are the softmax of its margins and its prediction is the
    largest ``probability / thresholds`` (the largest probability without thresholds).
    """
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    margins = x @ np.asarray(coefficients, np.float64).T + np.asarray(intercepts, np.float64)
    if margins.shape[1] == 1:
        m = margins[:, 0]
        raw = np.stack([-m, m], axis=1)
        p = 1.0 / (1.0 + np.exp(-m))
        probability = np.stack([1.0 - p, p], axis=1)
        cut = -np.inf if threshold == 0 else np.inf if threshold == 1 else np.log(threshold / (1 - threshold))
        return raw, probability, (m > cut).astype(np.float64)
    shifted = np.exp(margins - margins.max(axis=1, keepdims=True))
    probability = shifted / shifted.sum(axis=1, keepdims=True)
    scaled = probability if thresholds is None else probability / np.asarray(thresholds, np.float64)
    return margins, probability, scaled.argmax(axis=1).astype(np.float64)


def assemble_vectors(blocks: list[Any], rows: int) -> Tensor:
    """Concatenate numeric columns and tensor columns into one (M, D) float64 block, as VectorAssembler."""
    parts, valid = [], np.ones(rows, bool)
    for block in blocks:
        if isinstance(block, Tensor):
            full = np.full((rows, int(np.prod(block.values.shape[1:])) if block.values.ndim > 1 else 1), np.nan)
            full[block.valid] = block.values.reshape(int(block.valid.sum()), -1)
            parts.append(full)
            valid &= block.valid
        else:
            column = np.array([np.nan if v is None else float(v) for v in block], np.float64)
            parts.append(column[:, None])
            valid &= ~np.isnan(column)
    matrix = np.concatenate(parts, axis=1) if parts else np.zeros((rows, 0))
    return Tensor(matrix[valid], valid)


# -- adapters -------------------------------------------------------------------------------------
def _param(stage: Any, name: str, default: Any = None) -> Any:
    param = stage.getParam(name) if stage.hasParam(name) else None
    return stage.getOrDefault(param) if param is not None and stage.isDefined(param) else default


def _lr_kernel(stage: Any) -> StageKernel:
    coefficients = stage.coefficientMatrix.toArray()
    intercepts = stage.interceptVector.toArray()
    threshold = float(_param(stage, "threshold", 0.5))
    thresholds = _param(stage, "thresholds") if coefficients.shape[0] > 1 else None
    features = stage.getFeaturesCol()
    names = {key: _param(stage, col, "") for key, col in
             (("raw", "rawPredictionCol"), ("probability", "probabilityCol"), ("prediction", "predictionCol"))}

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        block = blocks[features]
        if not isinstance(block, Tensor):
            raise TypeError(f"LogisticRegressionModel: column {features!r} must hold vectors, "
                            f"found {type(block).__name__}")
        raw, probability, prediction = logistic_regression(block.values, coefficients, intercepts,
                                                           threshold, thresholds)
        full = np.full(len(block), np.nan)
        full[block.valid] = prediction
        out = {"raw": Tensor(raw, block.valid), "probability": Tensor(probability, block.valid),
               "prediction": full}
        return {names[k]: v for k, v in out.items() if names[k]}

    return StageKernel([features], [n for n in names.values() if n], run)


def _assembler_kernel(stage: Any) -> StageKernel:
    inputs, output = list(stage.getInputCols()), stage.getOutputCol()

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        return {output: assemble_vectors([blocks[c] for c in inputs], len(blocks[inputs[0]]))}

    return StageKernel(inputs, [output], run)


#: SparkML class name -> builder of its kernel from the fitted stage.
SPARKML_KERNELS: dict[str, Callable[[Any], StageKernel]] = {
    "LogisticRegressionModel": _lr_kernel,
    "VectorAssembler": _assembler_kernel,
}


def sparkml_kernel(stage: Any) -> StageKernel | None:
    """The kernel of a fitted SparkML stage from :data:`SPARKML_KERNELS`, or ``None`` without one."""
    builder = SPARKML_KERNELS.get(type(stage).__name__)
    return builder(stage) if builder is not None and type(stage).__module__.startswith("pyspark.") else None
