"""Kernels of SparkML's linear and neural predictors, with SparkML's numerics (float64).

:func:`classifier_kernel` and :func:`regressor_kernel` are the one adapter of every predictor (trees
included): they read ``featuresCol``, check the vector size, and write ``rawPredictionCol``,
``probabilityCol`` and ``predictionCol`` (a column whose name is empty is not written, as in
SparkML). The math is in plain functions over ``(N, D)`` float64 rows. Pure: no pyspark.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from irbis.kernels.blocks import Tensor
from irbis.kernels.chain import StageKernel
from irbis.kernels.sparkml.state import StageState, vector_block

__all__ = ["classifier_kernel", "linear_regression", "logistic_regression", "multilayer_perceptron",
           "regressor_kernel", "softmax", "threshold_prediction"]

#: Raw scores, probabilities and predictions of N rows.
Scores = tuple[np.ndarray, np.ndarray, np.ndarray]


# -- math -------------------------------------------------------------------------------------------
def softmax(margins: np.ndarray) -> np.ndarray:
    """Row-wise softmax, shifted by each row's largest margin as SparkML computes it; no rows give no rows."""
    if not margins.size:
        return margins
    shifted = np.exp(margins - margins.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def threshold_prediction(probability: np.ndarray, thresholds: Any = None) -> np.ndarray:
    """SparkML's class choice: the largest probability, or the largest ``probability / thresholds``.

    A zero threshold makes its class win (+inf) unless its probability is zero too (NaN, never chosen).
    """
    if thresholds is None:
        return probability.argmax(axis=1).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = probability / np.asarray(thresholds, np.float64)
    return np.where(np.isnan(scaled), -np.inf, scaled).argmax(axis=1).astype(np.float64)


def logistic_regression(x: np.ndarray, coefficients: np.ndarray, intercepts: np.ndarray,
                        threshold: float = 0.5, thresholds: np.ndarray | None = None) -> Scores:
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
    probability = softmax(margins)
    return margins, probability, threshold_prediction(probability, thresholds)


def linear_regression(x: np.ndarray, coefficients: np.ndarray, intercept: float) -> np.ndarray:
    """SparkML's ``LinearRegressionModel``: ``x · coefficients + intercept``."""
    return x @ coefficients + intercept


def multilayer_perceptron(x: np.ndarray, layers: list[int], weights: np.ndarray) -> np.ndarray:
    """The raw scores (last layer before the softmax) of SparkML's ``MultilayerPerceptronClassificationModel``.

    ``weights`` holds, per layer, its ``out × in`` matrix in column-major order, then its bias;
    hidden layers apply the logistic sigmoid.
    """
    offset, h = 0, x
    for i, (n_in, n_out) in enumerate(zip(layers[:-1], layers[1:])):
        w = weights[offset:offset + n_in * n_out].reshape(n_in, n_out)
        b = weights[offset + n_in * n_out:offset + n_in * n_out + n_out]
        offset += n_in * n_out + n_out
        h = h @ w + b
        if i < len(layers) - 2:
            h = 1.0 / (1.0 + np.exp(-h))
    return h


# -- adapters ---------------------------------------------------------------------------------------
def _spread(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    full = np.full(len(valid), np.nan)
    full[valid] = values
    return full


def classifier_kernel(state: StageState, size: int | None, score: Callable[[np.ndarray], Scores]) -> StageKernel:
    """A classifier's kernel: ``score`` maps (N, size) rows to raw scores, probabilities, predictions."""
    features = state.param("featuresCol", "features")
    names = {key: state.param(col, "") for key, col in
             (("raw", "rawPredictionCol"), ("probability", "probabilityCol"), ("prediction", "predictionCol"))}

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        block = vector_block(state.cls, features, blocks[features], size)
        raw, probability, prediction = score(block.values)
        out = {"raw": Tensor(raw, block.valid), "probability": Tensor(probability, block.valid),
               "prediction": _spread(prediction, block.valid)}
        return {names[k]: v for k, v in out.items() if names[k]}

    return StageKernel([features], [n for n in names.values() if n], run)


def regressor_kernel(state: StageState, size: int | None, predict: Callable[[np.ndarray], np.ndarray]) -> StageKernel:
    """A regressor's kernel: ``predict`` maps (N, size) rows to N predictions."""
    features, target = state.param("featuresCol", "features"), state.param("predictionCol", "prediction")

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        block = vector_block(state.cls, features, blocks[features], size)
        return {target: _spread(predict(block.values), block.valid)}

    return StageKernel([features], [target], run)


def _thresholds(state: StageState) -> Any:
    return state.param("thresholds") or None


def logistic_regression_kernel(state: StageState) -> StageKernel:
    """``LogisticRegressionModel``, binomial or multinomial, with threshold or thresholds."""
    coefficients = np.atleast_2d(state.data["coefficientMatrix"])
    intercepts = np.asarray(state.data["interceptVector"], np.float64)
    thresholds = _thresholds(state)
    threshold = float(state.param("threshold", 0.5))
    if coefficients.shape[0] == 1 and thresholds is not None:
        threshold = 1.0 / (1.0 + thresholds[0] / thresholds[1])
    return classifier_kernel(state, coefficients.shape[1], lambda x: logistic_regression(
        x, coefficients, intercepts, threshold, thresholds if coefficients.shape[0] > 1 else None))


def linear_regression_kernel(state: StageState) -> StageKernel:
    """``LinearRegressionModel`` (any loss: the prediction is linear)."""
    coefficients, intercept = np.asarray(state.data["coefficients"]), float(state.data["intercept"])
    return regressor_kernel(state, len(coefficients), lambda x: linear_regression(x, coefficients, intercept))


def perceptron_kernel(state: StageState) -> StageKernel:
    """``MultilayerPerceptronClassificationModel``: raw scores, their softmax, the likeliest class."""
    layers, weights = [int(n) for n in state.param("layers")], np.asarray(state.data["weights"])
    if len(weights) != sum(a * b + b for a, b in zip(layers[:-1], layers[1:])):
        raise ValueError(f"{state.cls}: {len(weights)} weights do not fit the layers {layers}")

    def score(x: np.ndarray) -> Scores:
        raw = multilayer_perceptron(x, layers, weights)
        probability = softmax(raw)
        return raw, probability, threshold_prediction(probability, _thresholds(state))

    return classifier_kernel(state, layers[0], score)
