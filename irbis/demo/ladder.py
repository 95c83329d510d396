"""The rungs of the camera-trap ladder: feature stages, camera-grouped folds, fitting and scoring.

=========  ==========================================================================================
LR120      logistic regression on the raw pixels, resized to 120 x 120 (the paper's LR120)
EN1        EfficientNet-Lite0 with its classifier cut: the pooled 1280-d head activation (RN1)
EN2        one more stage cut: the pooled 320-d output of the last block, before the 1 x 1 head
           convolution (RN2, "two layers cut"; see :data:`EN2_LAYER`)
+A         the better of EN1 / EN2 (chosen on the training cameras), trained on flipped, closer and
           darker copies of every image; test scores averaged over the copies
+E         +A with the scores averaged over each burst (:class:`irbis.ml.EnsembleByKey`)
+T         +E with a small MLP head in place of the logistic regression (standardised features, its
           width, weight decay and epochs chosen by the same grouped CV with the one-standard-error
           rule: :mod:`irbis.demo.head`), trained data-parallel on Spark by
           :class:`irbis.ml.TorchEstimator`; scores averaged over the copies and each burst as +E's
=========  ==========================================================================================

Each logistic regression's ``regParam`` is chosen by Spark ML's ``CrossValidator`` with ``foldCol``:
the folds are whole training cameras (:func:`camera_folds`), and the test cameras never enter it.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pandas as pd
from pyspark.ml import PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.evaluation import BinaryClassificationEvaluator, Evaluator
from pyspark.ml.feature import StandardScaler
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from irbis.ml.basic import Lambda
from irbis.ml.ensemble_by_key import EnsembleByKey
from irbis.ml.estimator import TorchEstimator
from irbis.ml.image import ImageTransformer, UnrollImage
from irbis.ml.image_featurizer import ImageFeaturizer
from irbis.models import get_entry

__all__ = ["EN2_LAYER", "KEYS", "LR_OPTIONS", "REG_GRID", "ROW_ORDER", "camera_folds",
           "feature_stages", "fit_head", "fit_lr", "pool_en2", "positive_score", "score_test_set",
           "select_head"]

KEYS = ["path", "label", "camera", "burst"]
#: A stable key of a training row (an image or one of its augmented copies): the head reads its rows in this order.
ROW_ORDER = ["path", "augmentation"]
#: The network of the deep rungs and EN2's layer: the last block's 320 x 7 x 7 output, which the
#: 1 x 1 head convolution (320 -> 1280), its batch norm and ReLU6 turn into EN1's map. Average-pooled
#: it is to EN1 what ResNet-50's pooled last stage with one more layer cut is to RN1.
MODEL, EN2_LAYER = "efficientnet_lite0", "_blocks.15"
#: regParam values the grouped cross-validation picks from.
REG_GRID = (0.01, 0.1, 1.0)
#: The regressions' solver settings. Each L-BFGS iteration is a Spark job, so the iteration cap sets the
#: cross-validations' time: 20 iterations halve LR120's (43,200 raw pixels) with the same chosen regParam
#: and a CV AUC no lower than 50 gave (``benchmarks/demo_lr.py``).
LR_OPTIONS: dict[str, Any] = {"maxIter": 20}


def _shape(layer: str) -> tuple[int, ...]:
    entry = get_entry(MODEL)
    return tuple(entry.layer_shapes[list(entry.layers).index(layer)])


def pool_channels(col: str, channels: int, positions: int) -> Column:
    """Average over the positions of each channel of a flattened (C, H, W) vector column: a C-d vector."""
    arr = vector_to_array(F.col(col))
    mean = F.transform(F.sequence(F.lit(0), F.lit(channels - 1)), lambda c: F.aggregate(
        F.slice(arr, c * positions + 1, positions), F.lit(0.0), lambda a, x: a + x) / positions)
    return array_to_vector(mean)


def pool_en2(df: DataFrame) -> DataFrame:
    """``f2`` = the average-pooled ``f2map`` (EN2's 320 x 7 x 7 map); a pipeline stage via ``Lambda``."""
    channels, h, w = _shape(EN2_LAYER)
    return df.withColumn("f2", pool_channels("f2map", channels, h * w)).drop("f2map")


def feature_stages(precision: str, raw_size: int) -> dict[str, list[Any]]:
    """The per-image stages that turn an ``image`` column into each feature column (raw, f1, f2), and
    ``deep``: f1 and f2 from one forward pass of the network (the featurisation of the originals)."""
    resize = ImageTransformer(inputCol="image", outputCol="small").resize(raw_size, raw_size, interpolation="area")
    f1_layer = ImageFeaturizer(network=MODEL, cutOutputLayers=1).feature_layer()
    return {
        "deep": [ImageFeaturizer(inputCol="image", network=MODEL, outputLayers=[f1_layer, EN2_LAYER],
                                 outputCols=["f1", "f2map"], precision=precision), Lambda(function=pool_en2)],
        "raw": [resize, UnrollImage(inputCol="small", outputCol="raw")],
        "f1": [ImageFeaturizer(inputCol="image", outputCol="f1", network=MODEL, cutOutputLayers=1,
                               precision=precision)],
        "f2": [ImageFeaturizer(inputCol="image", outputCol="f2map", network=MODEL, outputLayer=EN2_LAYER,
                               precision=precision), Lambda(function=pool_en2)],
    }


def camera_folds(cameras: np.ndarray, is_test: np.ndarray, folds: int, seed: int = 0,
                 unit: str = "cameras") -> np.ndarray:
    """The CV fold of each image: training cameras dealt round-robin into ``folds`` groups; -1 for test.

    A camera's images share one fold, so a fold's validation images come from cameras its training
    part never saw, as the test cameras are. Any grouping works the same way (the text ladder deals
    drugs); ``unit`` names the groups in the error.
    """
    train_cams = np.array(sorted(set(cameras[~is_test])))
    if len(train_cams) < folds:
        raise ValueError(f"grouped cross-validation with {folds} folds needs at least {folds} training "
                         f"{unit}, found {len(train_cams)}; add {unit} or lower the test share")
    order = np.random.default_rng(seed).permutation(train_cams)
    fold_of = {cam: i % folds for i, cam in enumerate(order)}
    return np.array([-1 if test else fold_of[cam] for cam, test in zip(cameras, is_test)], np.int32)


class _Counted(Evaluator):
    """``evaluator``, then ``done()``: one call per fold and setting of a cross-validation (its progress)."""

    def __init__(self, evaluator: Evaluator, done: Callable[[], None]) -> None:
        super().__init__()
        self._inner, self._done = evaluator, done

    def _evaluate(self, dataset: DataFrame) -> float:
        value = self._inner.evaluate(dataset)
        self._done()
        return value

    def isLargerBetter(self) -> bool:
        return self._inner.isLargerBetter()


def fit_lr(train: DataFrame, col: str, folds: int, parallelism: int = 2, grid: tuple[float, ...] = REG_GRID,
           on_fit: Callable[[], None] | None = None, **options: Any) -> tuple[Any, dict[str, Any]]:
    """Logistic regression on ``col`` with its regParam (of ``grid``) chosen by camera-grouped CV on ``train``.

    ``options`` override :data:`LR_OPTIONS` (``maxIter``, ``tol``, ...). The rows are coalesced to
    ``parallelism`` partitions: each L-BFGS step aggregates one gradient per partition, which for the
    43,200 raw pixels costs more than the few hundred rows themselves. ``on_fit`` is called as each of
    the ``folds x len(grid)`` fits of the CV is scored (a progress bar's step).
    """
    lr = LogisticRegression(featuresCol=col, labelCol="y", probabilityCol="probability",
                            rawPredictionCol="raw_prediction", **{**LR_OPTIONS, **options})
    params = ParamGridBuilder().addGrid(lr.regParam, list(grid)).build()
    evaluator: Any = BinaryClassificationEvaluator(labelCol="y", rawPredictionCol="raw_prediction")
    evaluator = evaluator if on_fit is None else _Counted(evaluator, on_fit)
    cv = CrossValidator(estimator=lr, estimatorParamMaps=params, evaluator=evaluator, numFolds=folds,
                        foldCol="fold", parallelism=parallelism, seed=0)
    model = cv.fit(train.select(col, "y", "fold").coalesce(parallelism))
    chosen = grid[int(np.argmax(model.avgMetrics))]
    cv_auc = {str(reg): round(float(auc), 4) for reg, auc in zip(grid, model.avgMetrics)}
    return model.bestModel, {"regParam": chosen, "cv_auc": cv_auc}


def select_head(train: DataFrame, col: str, seed: int = 0,
                on_fit: Callable[[], None] | None = None) -> tuple[dict[str, Any], dict[str, float], int]:
    """The MLP head's setting chosen by camera-grouped CV on ``train``
    (:func:`irbis.demo.head.cross_validate_head`): ``(best, table, features)``.

    The rows are sorted by :data:`ROW_ORDER` first: the order in which Spark hands back a union of
    cached frames follows its partitions, which is not part of the data, and the CV's mini-batches
    (hence its scores and choice) follow the row order.
    """
    from irbis.demo.head import cross_validate_head

    rows = cast(pd.DataFrame, train.select(*ROW_ORDER, vector_to_array(F.col(col)).alias("x"), "y", "fold")
                .toPandas()).sort_values(ROW_ORDER, ignore_index=True)
    x = np.stack(rows["x"].to_numpy()).astype(np.float32)
    best, table = cross_validate_head(x, rows["y"].to_numpy(np.int64), rows["fold"].to_numpy(), seed,
                                      on_fit=on_fit)
    return best, table, x.shape[1]


def fit_head(train: DataFrame, col: str, seed: int = 0,
             on_fit: Callable[[], None] | None = None) -> tuple[PipelineModel, dict[str, Any]]:
    """Standardisation + an MLP head (``d`` -> hidden -> 2) on ``col``, its width, weight decay and
    epochs chosen by camera-grouped CV on ``train`` (:func:`select_head`), then trained data-parallel
    on Spark by :class:`irbis.ml.TorchEstimator` (two barrier tasks) with ``seed``.

    The scaler and the estimator read the rows from one partition sorted by :data:`ROW_ORDER`, so
    that the training tasks' shards and their order do not depend on how the upstream jobs split
    the rows. Returns the fitted ``StandardScalerModel`` + ``TorchModel`` (writing ``logits``) as one
    ``PipelineModel``, and what CV chose.
    """
    from irbis.demo.head import BATCH, DECAY_OPTIMIZERS

    best, table, features = select_head(train, col, seed, on_fit)
    ordered = train.select(*ROW_ORDER, col, "y").coalesce(1).sortWithinPartitions(*ROW_ORDER)
    scaler = StandardScaler(inputCol=col, outputCol=f"{col}_std", withMean=True, withStd=True).fit(ordered)
    options = json.dumps({"in_features": features, "hidden": [best["hidden"]], "out_features": 2, "seed": seed})
    est = TorchEstimator(network="mlp", networkOptions=options, inputCol=f"{col}_std", labelCol="y",
                         predictionCol="logits", epochs=best["epochs"], batchSize=BATCH // 2,
                         optimizer=DECAY_OPTIMIZERS[best["weight_decay"]], numWorkers=2, seed=seed,
                         showProgress=False)
    head = est.fit(scaler.transform(ordered).select(f"{col}_std", F.col("y").cast("int").alias("y")))
    chosen = {**best, "cv_auc_by_hidden/decay/epochs": table,
              "head": f"standardised {col}, MLP {features}-{best['hidden']}-2, Adam (weight decay "
                      f"{best['weight_decay']:g}), {best['epochs']} epochs (the simplest setting within one "
                      "standard error of the best CV AUC), 2 data-parallel Spark tasks"}
    return PipelineModel(stages=[scaler, head]), chosen


def positive_score(model: Any, df: DataFrame) -> DataFrame:
    """``df`` through ``model`` with ``score``, the probability of class 1: from a two-logit ``logits``
    column (a TorchModel head) or from SparkML's ``probability`` vector."""
    out = model.transform(df)
    if "logits" in out.columns:  # the MLP head: softmax over its two logits
        logits = vector_to_array(F.col("logits")) if dict(out.dtypes)["logits"] == "vector" else F.col("logits")
        return out.withColumn("score", 1 / (1 + F.exp(logits[0] - logits[1])))
    return out.withColumn("score", vector_to_array(F.col("probability"))[1])


def score_test_set(model: Any, test: DataFrame, col: str, augmented: bool, bursts: bool) -> pd.DataFrame:
    """Per-image test scores (path, camera, burst, y, score), averaged over copies and/or bursts."""
    scored = positive_score(model, test.select(*KEYS, "y", "augmentation", col)).select(*KEYS, "y", "score")
    if augmented:  # average each image's scores over its augmented copies
        scored = (EnsembleByKey(keys=KEYS + ["y"], cols=["score"], colNames=["image_score"])
                  .transform(scored).withColumnRenamed("image_score", "score"))
    if bursts:  # average over the frames of each burst, keeping one row per image
        scored = (EnsembleByKey(keys=["camera", "burst"], cols=["score"], colNames=["burst_score"],
                                collapseGroup=False).transform(scored)
                  .drop("score").withColumnRenamed("burst_score", "score"))
    out = cast(pd.DataFrame, scored.select("path", "camera", "burst", "y", "score").toPandas())
    return out.sort_values("path", ignore_index=True)
