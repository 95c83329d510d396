"""LIME stages: ``ImageLIME`` (a Transformer) and ``TabularLIME`` (an Estimator) over any fitted model.

Each input row is explained inside the Spark task that holds it: its perturbations are scored in
mini-batches through the model's own batch kernels (:mod:`irbis.ml.lime_scoring`), so one Spark job
explains the whole DataFrame and the explanations run in parallel across tasks. The LIME math is pure
(:mod:`irbis.explain`). The Param names are SynapseML's (``targetCol``, ``targetClasses``,
``numSamples``, ``cellSize``, ``modifier``, ``samplingFraction``, ``regularization``, ``metricsCol``).

The explained ``model`` is not a Param (only JSON crosses the Params boundary): set it with the
constructor or ``setModel``; ``save`` writes it as a saved stage beside the metadata.
"""
from __future__ import annotations

import os
from functools import partial
from typing import Any, Callable

import numpy as np
from pyspark import keyword_only
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasSeed
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType, DataType, DoubleType, IntegerType, LongType, StringType, StructField, StructType,
)

from irbis.explain.lime import FeatureStats, check_num_samples, explain_image, explain_rows
from irbis.explain.segment import superpixels
from irbis.kernels.blocks import BatchFn, Images, Tensor, rows_in
from irbis.ml.base import IrbisEstimator, IrbisModel, IrbisTransformer
from irbis.ml.image import HasErrorCol
from irbis.ml.lime_scoring import LOG, local_kernels, local_score_fn, spark_score_fn
from irbis.ml.params import ColumnSetters, HasMiniBatchSize

__all__ = ["ImageLIME", "TabularLIME", "TabularLIMEModel"]

_WEIGHTS = ArrayType(ArrayType(DoubleType()))


def _param(name: str, doc: str, converter: Any) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=converter)


class _LIMEParams(ColumnSetters, HasErrorCol, HasMiniBatchSize, HasSeed):
    """Params and the explained model shared by the LIME stages."""

    targetCol = _param("targetCol", "the model's output column to explain (a vector or a number), "
                       "e.g. probability", TypeConverters.toString)
    targetClasses = _param("targetClasses", "indices into targetCol to explain; one weight list each",
                           TypeConverters.toListInt)
    numSamples = _param("numSamples", "perturbed samples per explained row", TypeConverters.toInt)
    regularization = _param("regularization", "L2 penalty of the weighted ridge fit (0: least squares)",
                            TypeConverters.toFloat)
    metricsCol = _param("metricsCol", "output column of the local fit's R², one per target class",
                        TypeConverters.toString)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(targetCol="probability", targetClasses=[0], regularization=0.0,
                         metricsCol="r2", errorCol="explainError", miniBatchSize=64, seed=0)
        self._model: Any = None

    def _init(self, kwargs: dict[str, Any]) -> None:
        model = kwargs.pop("model", None)
        self._set(**kwargs)
        if model is not None:
            self.setModel(model)
        self._check_params()

    def _check_params(self) -> None:
        classes = self.getOrDefault(self.targetClasses)
        if not classes or min(classes) < 0:
            raise ValueError(f"targetClasses must be a non-empty list of class indices >= 0, found {classes}")
        if self.getOrDefault(self.numSamples) < 2:
            raise ValueError(f"numSamples must be >= 2, found {self.getOrDefault(self.numSamples)}")
        if self.getOrDefault(self.regularization) < 0:
            raise ValueError(f"regularization must be >= 0, found {self.getOrDefault(self.regularization)}")

    def setParams(self, **kwargs: Any) -> Any:
        """Set any of the Params (and ``model``) by keyword."""
        self._init(kwargs)
        return self

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

    def getTargetCol(self) -> str:  # noqa: N802
        return self.getOrDefault(self.targetCol)

    def getTargetClasses(self) -> list[int]:  # noqa: N802
        return self.getOrDefault(self.targetClasses)

    def getNumSamples(self) -> int:  # noqa: N802
        return self.getOrDefault(self.numSamples)

    def _result_columns(self) -> list[tuple[str, DataType]]:
        cols = [(self.getOutputCol(), _WEIGHTS), (self.getOrDefault(self.metricsCol), ArrayType(DoubleType()))]
        return cols + ([(self.getErrorCol(), StringType())] if self.getErrorCol() else [])

    # -- the model as a scoring function ---------------------------------------------------------
    #: perturbed inputs (an array) -> the block that the model's first stage reads
    _to_block: Callable[[np.ndarray], Any]

    def _settings(self) -> dict[str, Any]:
        """Plain values of the Params that the per-row work needs (what travels to the workers)."""
        return dict(column=self.getInputCol(), output=self.getOutputCol(),
                    metrics=self.getOrDefault(self.metricsCol), error=self.getErrorCol(),
                    targets=self.getTargetClasses(), target_col=self.getTargetCol(),
                    num_samples=self.getNumSamples(), alpha=self.getOrDefault(self.regularization),
                    seed=self.getOrDefault(self.seed), batch_size=self.getMiniBatchSize())

    def _explainer(self) -> Callable[[Any, Callable[[np.ndarray], np.ndarray]], dict[str, Any]]:
        """A picklable ``(block, score) -> output blocks`` with the Params' values bound."""
        raise NotImplementedError

    def _local_score(self) -> Callable[[np.ndarray], np.ndarray]:
        kernels, missing = local_kernels(self.getModel())
        if missing:
            raise ValueError(f"{type(self).__name__}: the model's stages {missing} have no pandas kernel; "
                             f"explain a Spark DataFrame instead (a Spark job per batch of perturbations)")
        score, to_block = local_score_fn(kernels, self.getInputCol(), self.getTargetCol()), type(self)._to_block
        return lambda batch: score(to_block(batch))

    def _make_batch_fn(self) -> BatchFn:
        score, explain, col = self._local_score(), self._explainer(), self.getInputCol()
        return lambda blocks: explain(blocks[col], score)

    # -- Spark ------------------------------------------------------------------------------------
    def _transform_spark(self, df: DataFrame) -> DataFrame:
        if not local_kernels(self.getModel())[1]:
            return super()._transform_spark(df)
        self._check_schema(df.schema)
        LOG.warning("%s: explaining on the driver, one row at a time", type(self).__name__)
        return _explain_on_driver(self, df)

    # -- persistence ------------------------------------------------------------------------------
    def _has_extra(self) -> bool:
        return True

    def _save_extra(self, path: str) -> None:
        if self._model is not None:
            self._model.write().save(os.path.join(path, "model"))

    def _load_extra(self, path: str) -> None:
        from pyspark.ml.util import DefaultParamsReader
        from pyspark.sql import SparkSession

        folder = os.path.join(path, "model")
        if os.path.isdir(folder):
            spark = SparkSession.builder.getOrCreate()
            self._model = DefaultParamsReader.loadParamsInstance(folder, spark)


def _explain_on_driver(stage: Any, df: DataFrame) -> DataFrame:
    """The fallback for models without pandas kernels: collect the inputs, score with Spark jobs."""
    col, key = stage.getInputCol(), f"__irbis_row_{stage.uid}"
    score = spark_score_fn(stage.getModel(), df.sparkSession, col, df.schema[col], stage.getTargetCol())
    keyed = df.withColumn(key, F.monotonically_increasing_id()).cache()
    rows = keyed.select(key, stage._udf_input(df.schema[col])).collect()
    out = stage._explainer()(rows_in([r[1] for r in rows], col), score) if rows else {}
    names = [n for n, _ in stage._output_columns()]
    results = [(r[0], *[_plain(out[n][i]) for n in names]) for i, r in enumerate(rows)]
    schema = StructType([StructField(key, LongType())] + [StructField(n, t) for n, t in stage._output_columns()])
    return keyed.join(df.sparkSession.createDataFrame(results, schema), key, "left").drop(key)


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def _images_block(batch: np.ndarray) -> Images:
    return Images.from_arrays(list(batch))


def _rows_block(batch: np.ndarray) -> Tensor:
    return Tensor(batch, np.ones(len(batch), bool))


class ImageLIME(_LIMEParams, IrbisTransformer):
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

    cellSize = _param("cellSize", "side of a superpixel in pixels", TypeConverters.toFloat)
    modifier = _param("modifier", "SLIC compactness on the 0-255 colour scale (larger: squarer superpixels)",
                      TypeConverters.toFloat)
    samplingFraction = _param("samplingFraction", "probability that a superpixel is kept in a sample",
                              TypeConverters.toFloat)
    superpixelCol = _param("superpixelCol", "output column of superpixel labels (empty: none)",
                           TypeConverters.toString)

    @keyword_only
    def __init__(self, *, model: Any = None, inputCol: str = "image", outputCol: str = "weights",
                 targetCol: str = "probability", targetClasses: list[int] | None = None,
                 numSamples: int = 900, cellSize: float = 16.0, modifier: float = 130.0,
                 samplingFraction: float = 0.7, regularization: float = 0.0, metricsCol: str = "r2",
                 superpixelCol: str = "superpixels", errorCol: str = "explainError",
                 miniBatchSize: int = 64, seed: int = 0) -> None:
        super().__init__()
        self._setDefault(inputCol="image", outputCol="weights", numSamples=900, cellSize=16.0,
                         modifier=130.0, samplingFraction=0.7, superpixelCol="superpixels")
        self._init(dict(self._input_kwargs))

    def _check_params(self) -> None:
        super()._check_params()
        fraction, cell = self.getOrDefault(self.samplingFraction), self.getOrDefault(self.cellSize)
        if not 0 < fraction <= 1:
            raise ValueError(f"samplingFraction must be in (0, 1], found {fraction}")
        if cell < 1:
            raise ValueError(f"cellSize must be >= 1 pixel, found {cell}")

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        spx = self.getOrDefault(self.superpixelCol)
        cols = self._result_columns()
        return cols[:2] + ([(spx, ArrayType(IntegerType()))] if spx else []) + cols[2:]

    def _validate_schema(self, schema: StructType) -> None:
        from irbis.kernels.image import IMAGE_FIELDS

        found = schema[self.getInputCol()].dataType
        if not (isinstance(found, StructType) and not set(IMAGE_FIELDS) - set(found.names)):
            raise TypeError(f"ImageLIME: input column {self.getInputCol()!r} must be an image struct, "
                            f"found {found.simpleString()}")

    _to_block = staticmethod(_images_block)

    def _explainer(self) -> Callable[[Any, Callable[[np.ndarray], np.ndarray]], dict[str, Any]]:
        settings = dict(self._settings(), cell=int(round(self.getOrDefault(self.cellSize))),
                        modifier=self.getOrDefault(self.modifier),
                        fraction=self.getOrDefault(self.samplingFraction),
                        superpixels=self.getOrDefault(self.superpixelCol),
                        names=[n for n, _ in self._output_columns()])
        return partial(_explain_images, settings=settings)


def _explain_images(block: Any, score: Callable[[np.ndarray], np.ndarray], settings: dict[str, Any]) -> dict[str, Any]:
    """Explain each image of a block; a null or unusable image gets a reason (or raises without errorCol)."""
    if not isinstance(block, Images) and all(v is None for v in block):  # a column of nulls only
        block = Images.from_arrays([None] * len(block))
    if not isinstance(block, Images):
        raise TypeError(f"ImageLIME: column {settings['column']!r} must hold images")
    n, names, err_col = settings["num_samples"], settings["names"], settings["error"]
    out: dict[str, list[Any]] = {name: [] for name in names}
    for i in range(len(block)):
        try:
            image = block.image(i)
            if image is None:
                raise ValueError("the image is null")
            segments = superpixels(image, settings["cell"], settings["modifier"])
            check_num_samples(n, int(segments.max()) + 1, "superpixels of this image")
        except ValueError as err:
            if not err_col and block.valid[i]:
                raise ValueError(f"ImageLIME: column {settings['column']!r}: {err}") from err
            _append(out, names, [None] * (len(names) - 1) + [str(err) if err_col else None])
            continue
        found = explain_image(image, score, settings["targets"], num_samples=n, segments=segments,
                              fraction=settings["fraction"], alpha=settings["alpha"], seed=settings["seed"],
                              batch_size=settings["batch_size"], target_name=settings["target_col"])
        values = [found.weights.tolist(), found.r2.tolist()]
        values += [segments.reshape(-1)] if settings["superpixels"] else []
        _append(out, names, values + ([None] if err_col else []))
    return out


def _append(out: dict[str, list[Any]], names: list[str], values: list[Any]) -> None:
    for name, value in zip(names, values):
        out[name].append(value)


class TabularLIME(_LIMEParams, IrbisEstimator):
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

    @keyword_only
    def __init__(self, *, model: Any = None, inputCol: str = "features", outputCol: str = "weights",
                 targetCol: str = "probability", targetClasses: list[int] | None = None,
                 numSamples: int = 1000, regularization: float = 0.0, metricsCol: str = "r2",
                 errorCol: str = "explainError", miniBatchSize: int = 8192, seed: int = 0) -> None:
        super().__init__()
        self._setDefault(inputCol="features", outputCol="weights", numSamples=1000, miniBatchSize=8192)
        self._init(dict(self._input_kwargs))

    def _fit(self, dataset: Any) -> "TabularLIMEModel":
        from irbis.ml.lime_tabular import feature_stats

        stats = feature_stats(dataset, self.getInputCol())
        model = TabularLIMEModel(featureMeans=stats.mean.tolist(), featureStds=stats.std.tolist())
        model._set(**{p.name: v for p, v in self.extractParamMap().items() if model.hasParam(p.name)})
        model._model = self._model
        return model


class TabularLIMEModel(_LIMEParams, IrbisModel):
    """Explain table rows: a weight per feature (of the standardised values) and target class."""

    featureMeans = _param("featureMeans", "per-feature means of the background data", TypeConverters.toListFloat)
    featureStds = _param("featureStds", "per-feature standard deviations of the background data",
                         TypeConverters.toListFloat)

    @keyword_only
    def __init__(self, *, featureMeans: list[float] | None = None, featureStds: list[float] | None = None) -> None:
        super().__init__()
        self._setDefault(inputCol="features", outputCol="weights", numSamples=1000, miniBatchSize=8192,
                         featureMeans=[], featureStds=[])
        self._init(dict(self._input_kwargs))

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

    _to_block = staticmethod(_rows_block)

    def _make_batch_fn(self) -> BatchFn:
        check_num_samples(self.getNumSamples(), len(self.getOrDefault(self.featureMeans)))
        return super()._make_batch_fn()

    def _explainer(self) -> Callable[[Any, Callable[[np.ndarray], np.ndarray]], dict[str, Any]]:
        from irbis.ml.lime_tabular import explain_tensor

        return partial(explain_tensor, settings=self._settings(), stats=self.stats())

