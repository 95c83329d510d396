"""LIME stages: ``ImageLIME`` and ``TextLIME`` (Transformers) and ``TabularLIME`` (an Estimator) over any fitted model.

Each input row is explained inside the Spark task that holds it: its perturbations are scored in
mini-batches through the model's own batch kernels, so one Spark job explains the whole DataFrame and
the explanations run in parallel across tasks. The LIME math is pure (:mod:`irbis.explain`). The Param
names are SynapseML's (``targetCol``, ``targetClasses``, ``numSamples``, ``cellSize``, ``modifier``,
``samplingFraction``, ``regularization``, ``metricsCol``).

The model behind a stage is a scoring function over perturbed inputs. It runs inside the Spark task when
every stage has a kernel (:func:`scoring_chain`, over :func:`irbis.ml.kernel_pipeline.model_chain`): the
stage's kernel is then :class:`irbis.explain.explainer.LIMEKernel`, a plain value holding the model's kernels.
``EnsembleByKey`` is skipped: LIME scores single inputs, and a row alone in its group keeps its value, so
the stage is the identity per row. Any other stage makes the model run as a Spark job per batch of
perturbations instead (:func:`spark_score_fn`, over :class:`irbis.ml.kernel_pipeline.SparkBatches`).

What the stages share is :class:`LIMEParams`: their Params, the explained model (a saved sub-stage), the
Spark fallback. The explained ``model`` is not a Param (only JSON crosses the Params boundary): set it
with the constructor or ``setModel``; ``save`` writes it as a saved stage beside the metadata.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

import numpy as np
from pyspark.ml.param import TypeConverters
from pyspark.ml.param.shared import HasSeed
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from irbis.errors import NoKernelError, require_columns
from irbis.explain.explainer import LIMEKernel, explain_block
from irbis.explain.explanations import FeatureStats, check_num_samples
from irbis.kernels.blocks import Tensor, rows_in
from irbis.kernels.chain import ChainKernel, KernelChain
from irbis.ml.base import IrbisEstimator, IrbisModel, IrbisTransformer
from irbis.ml.ensemble_by_key import EnsembleByKey
from irbis.ml.kernel_pipeline import SparkBatches, model_chain
from irbis.ml.params import ColumnSetters, HasErrorCol, HasMiniBatchSize, Row, at_least, in_range, table_mixin
from irbis.spark.columns import column as quoted

__all__ = ["ImageLIME", "LIMEParams", "TabularLIME", "TabularLIMEModel", "TextLIME", "feature_stats", "scoring_chain",
           "spark_score_fn"]


LOG = logging.getLogger("irbis.explain")


def scoring_chain(model: Any) -> KernelChain:
    """The chain of the model's stages, ``EnsembleByKey`` left out; its ``missing`` are the stages that have
    no kernel."""
    return model_chain(model, skip=lambda stage: isinstance(stage, EnsembleByKey))


def check_target(chain: KernelChain, target_col: str) -> None:
    """The model must write ``target_col``; name what it writes otherwise."""
    if target_col not in chain.outputs:
        raise ValueError(f"the model does not produce targetCol {target_col!r}; it writes {chain.outputs}")


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


_WEIGHTS = ArrayType(ArrayType(DoubleType()))


#: LIME's own Params (SynapseML's names), declared through the one Param table of ``irbis.ml.params``.
LIME_PARAMS: list[Row] = [
    ("targetCol", "the model's output column to explain (a vector or a number), e.g. probability",
     TypeConverters.toString, "probability"),
    ("targetClasses", "indices into targetCol to explain; one weight list each", TypeConverters.toListInt, [0]),
    ("numSamples", "perturbed samples per explained row", TypeConverters.toInt, None, at_least(2)),
    ("regularization", "L2 penalty of the weighted ridge fit (0: least squares)", TypeConverters.toFloat, 0.0,
     at_least(0)),
    ("metricsCol", "output column of the local fit's R², one per target class", TypeConverters.toString, "r2"),
]


HasLIMEParams: Any = table_mixin("HasLIMEParams", LIME_PARAMS)


class LIMEParams(ColumnSetters, HasErrorCol, HasMiniBatchSize, HasSeed, HasLIMEParams):
    """Params and the explained model shared by the LIME stages."""

    _defaults = {"errorCol": "explainError", "seed": 0}
    _extra_keywords = ("model",)

    def _init_state(self) -> None:
        self._model: Any = None

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        model = kwargs.pop("model", None)  # the explained model, not a Param
        if model is not None:
            self.setModel(model)
        return kwargs

    def _check_params(self) -> None:
        classes = self.getOrDefault(self.targetClasses)
        if not classes or min(classes) < 0:
            raise ValueError(f"targetClasses must be a non-empty list of class indices >= 0, found {classes}")

    def setModel(self, value: Any) -> Any:  # noqa: N802
        """Set the fitted Transformer or PipelineModel to explain."""
        if not hasattr(value, "transform"):
            raise TypeError(f"model must be a fitted Transformer or PipelineModel, found {type(value).__name__}")
        self._model = value
        return self

    def getModel(self) -> Any:  # noqa: N802
        """The explained model."""
        if self._model is None:
            raise ValueError(f"{type(self).__name__}: set the model to explain (setModel)")
        return self._model

    def _result_columns(self) -> list[tuple[str, DataType]]:
        cols = [(self.getOutputCol(), _WEIGHTS), (self.getOrDefault(self.metricsCol), ArrayType(DoubleType()))]
        return cols + ([(self.getErrorCol(), StringType())] if self.getErrorCol() else [])

    # -- the model as a scoring function ---------------------------------------------------------
    #: the kind of input the stage explains (a key of :data:`irbis.explain.explainer.EXPLAINERS`)
    _kind: str

    def _settings(self, chain: KernelChain | None = None) -> dict[str, Any]:
        """Plain values of the Params that the per-row work needs (what travels to the workers); ``chain``:
        the model's kernels where they score it, None where Spark jobs do."""
        return dict(column=self.getInputCol(), output=self.getOutputCol(),
                    metrics=self.getOrDefault(self.metricsCol), error=self.getErrorCol(),
                    targets=self.getTargetClasses(), target_col=self.getTargetCol(),
                    num_samples=self.getNumSamples(), alpha=self.getOrDefault(self.regularization),
                    seed=self.getOrDefault(self.seed), batch_size=self.getMiniBatchSize())

    def _stats(self) -> FeatureStats | None:
        """The background data's statistics where the kind of input needs them (rows)."""
        return None

    def _make_batch_fn(self) -> LIMEKernel:
        chain = scoring_chain(self.getModel())
        missing = [s.name for s in chain.missing]
        if missing:
            raise NoKernelError(missing, f"{type(self).__name__}: the model's stages {missing} have no kernel; "
                                         "explain a Spark DataFrame instead (a Spark job per batch of perturbations)")
        column, target = self.getInputCol(), self.getTargetCol()
        check_target(chain, target)
        others = [c for c in chain.inputs if c != column]
        if others:
            raise ValueError(f"the model reads column {others[0]!r}, which LIME does not have: it scores "
                             f"perturbed {column!r} values alone")
        return LIMEKernel(self._kind, ChainKernel.of(chain, [target]), self._settings(chain), self._stats())

    # -- Spark ------------------------------------------------------------------------------------
    def _transform_spark(self, df: DataFrame) -> DataFrame:
        if not scoring_chain(self.getModel()).missing:
            return super()._transform_spark(df)
        self._check_schema(df.schema)
        return _explain_on_driver(self, df)

    # -- persistence ------------------------------------------------------------------------------
    def _has_extra(self) -> bool:
        return True

    def _save_extra(self, path: str) -> None:
        if self._model is not None:
            self._model.write().save(os.path.join(path, "model"))

    def _load_extra(self, path: str) -> None:
        from pyspark.ml.util import DefaultParamsReader

        from irbis.spark.session import active_session

        folder = os.path.join(path, "model")
        if os.path.isdir(folder):  # the model may hold JVM stages: read in the session in use (Connect too)
            spark = active_session(f"loading a saved {type(self).__name__}")
            self._model = DefaultParamsReader.loadParamsInstance(folder, spark)


def _explain_on_driver(stage: Any, df: DataFrame) -> DataFrame:
    """The fallback for models without pandas kernels: collect the inputs, score with Spark jobs.

    The rows are keyed and cached, so that the explanations join back to the rows they were made for.
    """
    col, key = stage.getInputCol(), f"__irbis_row_{stage.uid}"
    score = spark_score_fn(stage.getModel(), df.sparkSession, col, df.schema[col], stage.getTargetCol())
    keyed = df.withColumn(key, F.monotonically_increasing_id()).cache()
    rows = keyed.select(key, stage._udf_input(df.schema[col])).collect()
    out = (explain_block(stage._kind, rows_in([r[1] for r in rows], col), score, stage._settings(), stage._stats())
           if rows else {})
    names = [n for n, _ in stage._output_columns()]
    results = [(r[0], *[_plain(out[n][i]) for n in names]) for i, r in enumerate(rows)]
    schema = StructType([StructField(key, LongType())] + [StructField(n, t) for n, t in stage._output_columns()])
    return keyed.join(df.sparkSession.createDataFrame(results, schema), key, "left").drop(key)


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def feature_stats(dataset: Any, column: str) -> FeatureStats:
    """Per-feature mean and standard deviation of a vector column, ignoring nulls and NaN.

    On Spark the statistics are one aggregation in SQL (no rows are collected); a frame without a
    non-null row gives no features.
    """
    if hasattr(dataset, "sparkSession"):
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import functions as F

        found = dataset.schema[column].dataType if column in dataset.columns else None
        if not isinstance(found, VectorUDT):
            raise TypeError(f"TabularLIME: input column {column!r} must be a vector, found "
                            f"{'no such column' if found is None else found.simpleString()}; "
                            f"the DataFrame has columns {dataset.columns}")
        values = F.when(quoted(column).isNotNull(), vector_to_array(quoted(column)))
        cells = dataset.select(F.posexplode(values).alias("i", "v"))
        finite = F.when(~F.isnan("v"), F.col("v"))
        rows = cells.groupBy("i").agg(F.avg(finite).alias("m"), F.stddev_pop(finite).alias("s")).collect()
        size = max((r.i for r in rows), default=-1) + 1
        mean, std = np.zeros(size), np.ones(size)
        for r in rows:  # a feature with no finite value keeps mean 0 and std 1
            mean[r.i] = r.m if r.m is not None else 0.0
            std[r.i] = r.s if r.s else 1.0
        return FeatureStats(mean, std)
    require_columns("TabularLIME", dataset.columns, [column])
    block = rows_in(dataset[column].tolist(), column)
    if not isinstance(block, Tensor):
        raise TypeError(f"TabularLIME: input column {column!r} must hold vectors")
    if not len(block.values):
        return FeatureStats(np.zeros(0), np.ones(0))
    return FeatureStats.from_data(block.values.reshape(len(block.values), -1))


class TabularLIME(LIMEParams, IrbisEstimator):
    """Fit per-feature statistics on background data, to explain a model's predictions on table rows.

    ``inputCol`` is a vector column, the one the model reads. ``fit`` records each feature's mean and
    standard deviation (ignoring nulls and NaN); the fitted :class:`TabularLIMEModel` explains each row
    from ``numSamples`` samples drawn from those normals (the ``lime`` package's continuous sampling),
    weighting one standardised feature each.

    Examples
    --------
    >>> lime = TabularLIME(model=lr_model, inputCol="features", targetClasses=[1]).fit(train)  # doctest: +SKIP
    >>> lime.transform(test).select("weights", "r2")                                            # doctest: +SKIP
    """

    _defaults = {"inputCol": "features", "outputCol": "weights", "numSamples": 1000, "miniBatchSize": 8192}

    def _fit(self, dataset: Any) -> "TabularLIMEModel":
        stats = feature_stats(dataset, self.getInputCol())
        model = TabularLIMEModel(featureMeans=stats.mean.tolist(), featureStds=stats.std.tolist())
        model._set(**{p.name: v for p, v in self.extractParamMap().items() if model.hasParam(p.name)})
        model._model = self._model
        return model


_STATS_PARAMS: Any = table_mixin("HasFeatureStats", [
    ("featureMeans", "per-feature means of the background data", TypeConverters.toListFloat, []),
    ("featureStds", "per-feature standard deviations of the background data", TypeConverters.toListFloat, []),
])


class TabularLIMEModel(LIMEParams, _STATS_PARAMS, IrbisModel):
    """Explain table rows: a weight per feature (of the standardised values) and target class."""

    _accepts = frozenset({"vector"})

    _defaults = TabularLIME._defaults

    def stats(self) -> FeatureStats:
        """The background statistics as arrays."""
        return FeatureStats(np.asarray(self.getOrDefault(self.featureMeans), np.float64),
                            np.asarray(self.getOrDefault(self.featureStds), np.float64))

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        return self._result_columns()

    def _validate_schema(self, schema: StructType) -> None:
        from pyspark.ml.linalg import VectorUDT

        found = schema[self.getInputCol()].dataType
        if not isinstance(found, VectorUDT):
            raise TypeError(f"TabularLIMEModel: input column {self.getInputCol()!r} must be a vector, "
                            f"found {found.simpleString()}")
        check_num_samples(self.getNumSamples(), len(self.getOrDefault(self.featureMeans)))

    _kind = "rows"

    def _make_batch_fn(self) -> LIMEKernel:
        check_num_samples(self.getNumSamples(), len(self.getOrDefault(self.featureMeans)))
        return super()._make_batch_fn()

    def _stats(self) -> FeatureStats:
        return self.stats()


TabularLIME._model_class = TabularLIMEModel  # the Model class that TabularLIME.fit returns


_TEXT_LIME_PARAMS: Any = table_mixin("HasTextLIMEParams", [
    ("samplingFraction", "probability that a word is kept in a sample", TypeConverters.toFloat, 0.7,
     in_range(0, 1, low_open=True)),
    ("tokensCol", "output column of the explained words, one per weight (empty: none)", TypeConverters.toString,
     "tokens"),
])


class TextLIME(LIMEParams, _TEXT_LIME_PARAMS, IrbisTransformer):
    """Explain a model's predictions on texts: a weight per word and target class (LIME).

    Each text's words (runs of word characters) are removed at random (each kept with probability
    ``samplingFraction``) in ``numSamples`` copies, which are scored through the model's batch kernels
    ``miniBatchSize`` at a time (a text pipeline: :class:`TextEmbedder` and a classifier, or
    :class:`TextClassifierModel`), and a weighted ridge fit of ``targetCol[targetClasses]`` on the on/off
    masks gives each word's weight. ``tokensCol`` names the words, in order.

    Examples
    --------
    >>> lime = TextLIME(model=pipeline, inputCol="review", targetClasses=[1], numSamples=500)   # doctest: +SKIP
    >>> lime.transform(reviews).select("tokens", "weights")                                     # doctest: +SKIP
    """

    _accepts = frozenset({"string"})
    _kind = "texts"

    _defaults = {"inputCol": "text", "outputCol": "weights", "numSamples": 1000}

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        tokens = self.getOrDefault(self.tokensCol)
        cols = self._result_columns()
        return cols[:2] + ([(tokens, ArrayType(StringType()))] if tokens else []) + cols[2:]

    def _validate_schema(self, schema: StructType) -> None:
        found = schema[self.getInputCol()].dataType
        if not isinstance(found, (StringType, BinaryType)):
            raise TypeError(f"TextLIME: input column {self.getInputCol()!r} must hold text (string), found "
                            f"{found.simpleString()}")

    def _settings(self, chain: KernelChain | None = None) -> dict[str, Any]:
        return dict(super()._settings(chain), fraction=self.getOrDefault(self.samplingFraction),
                    tokens=self.getOrDefault(self.tokensCol))


def _network_input(model: Any, column: str, chain: KernelChain | None) -> Any:
    """The preprocessing of the model's first stage when it is an image network reading ``column``
    (an :class:`~irbis.ml.image_network.ImageNetworkStage`: ImageFeaturizer, a fitted image classifier) and
    the model's kernels (``chain``) score it: LIME then masks its preprocessed input instead of
    preprocessing every masked image. None otherwise (a model scored by Spark jobs takes the images)."""
    from irbis.ml.image_network import ImageNetworkStage
    from irbis.ml.kernel_pipeline import flatten

    stages = [s for s in flatten(model) if not isinstance(s, EnsembleByKey)]
    first = stages[0] if stages else None
    if isinstance(first, ImageNetworkStage) and first.getInputCol() == column and chain and not chain.missing:
        return first._preprocessing()
    return None

_IMAGE_PARAMS: Any = table_mixin("HasImageLIMEParams", [
    ("cellSize", "side of a superpixel in pixels", TypeConverters.toFloat, 16.0, at_least(1)),
    ("modifier", "SLIC compactness on the 0-255 colour scale (larger: squarer superpixels)",
     TypeConverters.toFloat, 130.0, in_range(0, low_open=True)),
    ("samplingFraction", "probability that a superpixel is kept in a sample", TypeConverters.toFloat, 0.7,
     in_range(0, 1, low_open=True)),
    ("superpixelCol", "output column of superpixel labels (empty: none)", TypeConverters.toString, "superpixels"),
])


class ImageLIME(LIMEParams, _IMAGE_PARAMS, IrbisTransformer):
    """Explain a model's predictions on images: a weight per superpixel and target class (LIME).

    Each image is cut into superpixels (SLIC, about ``cellSize`` pixels a side); ``numSamples``
    copies with random superpixels blacked out (each kept with probability ``samplingFraction``) are
    scored through the model's batch kernels, ``miniBatchSize`` at a time, and a weighted ridge fit of
    ``targetCol[targetClasses]`` on the on/off masks gives each superpixel's weight.

    Parameters
    ----------
    model : Transformer or PipelineModel
        The fitted model; it must read ``inputCol`` (an image struct column) and write ``targetCol``.
        Irbis stages, ``LogisticRegressionModel`` and ``VectorAssembler`` run inside the task;
        ``EnsembleByKey`` is skipped (the identity for a single image). Other stages are run as a
        Spark job per batch of perturbations from the driver, with a warning.
    outputCol, metricsCol, superpixelCol, errorCol : str
        Weights (one list per target class), the fits' R², the superpixel labels (row-major, H·W
        values; empty for none), and the reason a row has no explanation (a null or too small image;
        empty to raise instead).

    Examples
    --------
    >>> lime = ImageLIME(model=pipeline, inputCol="image", targetCol="probability",
    ...                  targetClasses=[1], numSamples=500)            # doctest: +SKIP
    >>> lime.transform(images).select("path", "weights", "superpixels")  # doctest: +SKIP
    """

    _extras = ("images", "explain")

    _accepts = frozenset({"image"})

    _defaults = {"inputCol": "image", "outputCol": "weights", "numSamples": 900}

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        spx = self.getOrDefault(self.superpixelCol)
        cols = self._result_columns()
        return cols[:2] + ([(spx, ArrayType(IntegerType()))] if spx else []) + cols[2:]

    def _validate_schema(self, schema: StructType) -> None:
        from irbis.ml.column_types import is_image_struct

        found = schema[self.getInputCol()].dataType
        if not is_image_struct(found):
            raise TypeError(f"ImageLIME: input column {self.getInputCol()!r} must be an image struct, "
                            f"found {found.simpleString()}")

    _kind = "images"

    def _settings(self, chain: KernelChain | None = None) -> dict[str, Any]:
        return dict(super()._settings(chain), cell=int(round(self.getOrDefault(self.cellSize))),
                    modifier=self.getOrDefault(self.modifier),
                    fraction=self.getOrDefault(self.samplingFraction),
                    superpixels=self.getOrDefault(self.superpixelCol),
                    names=[n for n, _ in self._output_columns()],
                    network_input=_network_input(self.getModel(), self.getInputCol(), chain))
