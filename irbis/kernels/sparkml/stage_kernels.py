"""Fitted SparkML stages as pure batch kernels, so that a pipeline runs without a Spark job.

SparkML's fitted models compute in the JVM. :data:`SPARKML_KERNELS` maps a stage's class name to a
builder that takes the stage's state (its Params and fitted data, a
:class:`~irbis.kernels.sparkml.state.StageState`) and returns a :class:`StageKernel`, a
:data:`~irbis.kernels.blocks.BatchFn` over column blocks with SparkML's numerics. The state comes
from either side of the Spark boundary:

* :func:`load_sparkml_kernel` reads a stage saved by SparkML (metadata JSON + Parquet) with pyarrow,
  with no Spark at all: the HTTP server compiles a saved pipeline this way;
* :func:`sparkml_kernel` reads a live fitted stage's public Params and attributes
  (``coefficientMatrix``, ``labelsArray``, ...): explanations (LIME) score perturbed inputs inside a
  Spark task this way. Stages whose fitted state PySpark does not expose (trees, Imputer) have no
  live kernel.

The module imports no ``pyspark``: it only reads attributes of the stage it is given.

Examples
--------
>>> kernel = load_sparkml_kernel("model/stages/2_LogisticRegression_7c1d")  # doctest: +SKIP
>>> kernel.fn({"features": Tensor(x, valid)})["probability"].values        # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from irbis.kernels.blocks import Tensor
from irbis.kernels.chain import StageKernel
from irbis.kernels.sparkml.features import imputer, min_max_scaler, one_hot_encoder, standard_scaler, string_indexer
from irbis.kernels.sparkml.predictors import (
    linear_regression_kernel,
    logistic_regression,
    logistic_regression_kernel,
    perceptron_kernel,
)
from irbis.kernels.sparkml.state import NoKernelError, StageState, read_stage
from irbis.kernels.sparkml.trees import tree_classifier, tree_regressor

__all__ = ["INPUT_KINDS", "SPARKML_KERNELS", "NoKernelError", "assemble_vectors", "kernel_from_state",
           "load_sparkml_kernel", "logistic_regression", "sparkml_kernel"]


# -- math -----------------------------------------------------------------------------------------
def assemble_vectors(blocks: list[Any], rows: int, keep: bool = False) -> Tensor:
    """Concatenate numeric columns and tensor columns into one (M, D) float64 block, as VectorAssembler.

    A row with a null or NaN is null in the result, or (``keep``) kept with NaN in its place.
    """
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
    valid = valid | keep
    return Tensor(matrix[valid], valid)




# -- builders ---------------------------------------------------------------------------------------
def _assembler_kernel(state: StageState) -> StageKernel:
    """``VectorAssembler``: handleInvalid "error" raises on a null or NaN, "skip" drops the row, "keep"
    keeps NaN."""
    inputs, output = list(state.param("inputCols")), state.param("outputCol")
    policy = state.param("handleInvalid", "error")

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        rows = len(blocks[inputs[0]])
        out = assemble_vectors([blocks[c] for c in inputs], rows, keep=policy == "keep")
        if policy == "error" and not out.valid.all():
            row = int(np.flatnonzero(~out.valid)[0])
            column = next(c for c in inputs if not assemble_vectors([blocks[c]], rows).valid[row])
            raise ValueError(f"VectorAssembler: column {column!r} has a null or NaN at row {row}; set "
                             "handleInvalid to 'skip' or 'keep' to accept it.")
        return {output: out}

    return StageKernel(inputs, [output], run, drops_rows=policy == "skip", nulls=policy != "error")


#: SparkML class name -> builder of its kernel from the fitted stage's state.
SPARKML_KERNELS: dict[str, Callable[[StageState], StageKernel]] = {
    "VectorAssembler": _assembler_kernel,
    "StandardScalerModel": standard_scaler,
    "MinMaxScalerModel": min_max_scaler,
    "StringIndexerModel": string_indexer,
    "OneHotEncoderModel": one_hot_encoder,
    "ImputerModel": imputer,
    "LogisticRegressionModel": logistic_regression_kernel,
    "LinearRegressionModel": linear_regression_kernel,
    "MultilayerPerceptronClassificationModel": perceptron_kernel,
    **{f"{kind}ClassificationModel": tree_classifier for kind in ("DecisionTree", "RandomForest", "GBT")},
    **{f"{kind}RegressionModel": tree_regressor for kind in ("DecisionTree", "RandomForest", "GBT")},
}

#: SparkML class name -> the fitted data a live stage exposes, under the names SparkML saves it with.
LIVE_DATA: dict[str, Callable[[Any], dict[str, Any]]] = {
    "VectorAssembler": lambda s: {},
    "StandardScalerModel": lambda s: {"mean": s.mean.toArray(), "std": s.std.toArray()},
    "MinMaxScalerModel": lambda s: {"originalMin": s.originalMin.toArray(),
                                    "originalMax": s.originalMax.toArray()},
    "StringIndexerModel": lambda s: {"labelsArray": s.labelsArray},
    "OneHotEncoderModel": lambda s: {"categorySizes": s.categorySizes},
    "LogisticRegressionModel": lambda s: {"coefficientMatrix": s.coefficientMatrix.toArray(),
                                          "interceptVector": s.interceptVector.toArray()},
    "LinearRegressionModel": lambda s: {"coefficients": s.coefficients.toArray(), "intercept": s.intercept},
    "MultilayerPerceptronClassificationModel": lambda s: {"weights": s.weights.toArray()},
}


#: SparkML class name -> the kinds of value (:data:`~irbis.kernels.chain.KINDS`) its input
#: columns accept; a class not listed reads vectors (its ``featuresCol``, or a vector ``inputCol``).
INPUT_KINDS: dict[str, frozenset[str]] = {
    "VectorAssembler": frozenset({"number", "vector"}),
    "StringIndexerModel": frozenset({"string", "number"}),
    "ImputerModel": frozenset({"number"}),
    "OneHotEncoderModel": frozenset({"number"}),
}


def kernel_from_state(state: StageState) -> StageKernel:
    """The kernel of a stage's state; :class:`NoKernelError` naming the class where it has none."""
    builder = SPARKML_KERNELS.get(state.cls)
    if builder is None:
        raise NoKernelError(state.cls, f"SparkML stage {state.cls} has no kernel; stages with kernels: "
                                       f"{', '.join(sorted(SPARKML_KERNELS))}. Serve it through Spark, or "
                                       "replace the stage.")
    kernel = builder(state)
    kinds = INPUT_KINDS.get(state.cls, frozenset({"vector"}))
    kernel.kinds = {c: kinds for c in kernel.inputs}
    return kernel


def load_sparkml_kernel(path: str) -> StageKernel:
    """The kernel of a SparkML stage saved at ``path`` (a local folder), read without Spark."""
    return kernel_from_state(read_stage(path))


def sparkml_kernel(stage: Any) -> StageKernel | None:
    """The kernel of a live fitted SparkML stage, or ``None`` where it has none (see :data:`LIVE_DATA`)."""
    name = type(stage).__name__
    if name not in LIVE_DATA or not type(stage).__module__.startswith("pyspark."):
        return None
    params = {param.name: value for param, value in stage.extractParamMap().items()}
    return kernel_from_state(StageState(name, params, LIVE_DATA[name](stage)))
