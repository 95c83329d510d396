"""SparkML stage kernels built from saved folders (no Spark) equal SparkML's transform on the same rows."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import Pipeline
from pyspark.ml import classification as C
from pyspark.ml import feature as F
from pyspark.ml import regression as R
from pyspark.ml.linalg import Vectors
from sklearn.datasets import load_digits

from irbis.kernels.blocks import Tensor, run_steps
from irbis.kernels.sparkml.stage_kernels import NoKernelError, load_sparkml_kernel, sparkml_kernel
from irbis.kernels.sparkml.state import read_stage

pytestmark = pytest.mark.spark

RTOL, ATOL = 1e-9, 1e-12


@pytest.fixture(scope="module")
def digits(spark):
    """300 digits: 64 pixel features (some constant), the digit, a binary label and a real target;
    ``mixed`` adds two features with 4 values that tell the labels and the target apart."""
    x, y = load_digits(return_X_y=True)
    x, y = x[:300], y[:300]
    target = x[:, 20:28].mean(axis=1)
    rows = [(Vectors.dense(a), float(b), float(b < 5), float(t), Vectors.dense(np.r_[a, b % 4, min(t // 4, 3)]))
            for a, b, t in zip(x, y, target)]
    return spark.createDataFrame(rows, ["features", "label", "binary", "target", "mixed"]).cache()


@pytest.fixture(scope="module")
def categories(spark):
    """Generated rows with categorical strings, nulls, and numbers with nulls and NaN."""
    rng = np.random.default_rng(3)
    colors = ["red", "green", "blue", "green", "green", "red", None]
    rows = [(colors[i % 7], ["s", "m", "l"][int(rng.integers(3))], float(i % 4),
             None if i % 9 == 0 else float(rng.normal()), float("nan") if i % 7 == 0 else float(rng.integers(5)))
            for i in range(80)]
    return spark.createDataFrame(rows, "color string, size string, level double, a double, b double")


def _block(values: list) -> object:
    """Collected column values as the block a kernel receives."""
    if any(hasattr(v, "toArray") for v in values):
        valid = np.array([v is not None for v in values])
        return Tensor(np.array([v.toArray() for v in values if v is not None]), valid)
    if any(isinstance(v, str) for v in values):
        return np.array(values, dtype=object)
    return np.array([np.nan if v is None else v for v in values], np.float64)


def _run(model, df, tmp_path, inputs):
    """Save ``model``, build its kernel from the folder, and run it on ``df``'s rows; also give the
    SparkML transform's rows."""
    path = str(tmp_path / type(model).__name__)
    model.write().overwrite().save(path)
    kernel = load_sparkml_kernel(path)
    assert sorted(kernel.inputs) == sorted(inputs)
    rows = df.collect()
    out = kernel.fn({c: _block([r[c] for r in rows]) for c in inputs})
    return kernel, out, model.transform(df).collect()


def _check(block, expected: list, exact: bool = False) -> None:
    """A kernel's output block equals the SparkML column (vectors as arrays, nulls as None)."""
    if isinstance(block, Tensor):
        assert block.valid.tolist() == [v is not None for v in expected]
        want = np.array([v.toArray() for v in expected if v is not None])
        np.testing.assert_allclose(block.values, want.reshape(block.values.shape), rtol=RTOL, atol=ATOL)
    else:
        want = np.array([np.nan if v is None else v for v in expected], np.float64)
        if exact:
            np.testing.assert_array_equal(block, want)
        else:
            np.testing.assert_allclose(block, want, rtol=RTOL, atol=ATOL)


# -- feature stages ---------------------------------------------------------------------------------
@pytest.mark.parametrize("with_mean,with_std", [(True, True), (False, True), (True, False)])
def test_standard_scaler(digits, tmp_path, with_mean, with_std):
    model = F.StandardScaler(inputCol="features", outputCol="scaled", withMean=with_mean,
                             withStd=with_std).fit(digits)
    _, out, rows = _run(model, digits, tmp_path, ["features"])
    _check(out["scaled"], [r.scaled for r in rows])


def test_min_max_scaler(digits, tmp_path):
    model = F.MinMaxScaler(inputCol="features", outputCol="scaled", min=-1.0, max=2.0).fit(digits)
    _, out, rows = _run(model, digits, tmp_path, ["features"])
    _check(out["scaled"], [r.scaled for r in rows])


@pytest.mark.parametrize("order", ["frequencyDesc", "frequencyAsc", "alphabetDesc", "alphabetAsc"])
def test_string_indexer_orderings_and_invalid_rows(spark, categories, tmp_path, order):
    fitted = F.StringIndexer(inputCols=["color", "size"], outputCols=["ci", "si"], stringOrderType=order,
                             handleInvalid="keep").fit(categories.where("color IS NOT NULL"))
    unseen = spark.createDataFrame([("violet", "m"), (None, "l"), ("red", "xl")], "color string, size string")
    df = categories.select("color", "size").unionByName(unseen)
    kernel, out, rows = _run(fitted, df, tmp_path, ["color", "size"])
    _check(out["ci"], [r.ci for r in rows], exact=True)
    _check(out["si"], [r.si for r in rows], exact=True)
    assert out["ci"][-3:].tolist() == [3.0, 3.0, fitted.labelsArray[0].index("red")]
    if order != "frequencyDesc":
        return
    kernel, out, rows = _run(fitted.setHandleInvalid("skip"), df, tmp_path, ["color", "size"])
    kept = ~np.isnan(out["ci"]) & ~np.isnan(out["si"])
    assert kernel.drops_rows and kept.sum() == len(rows) == 70 - 1
    _check(out["ci"][kept], [r.ci for r in rows], exact=True)

    kernel, _, _ = _run(fitted.setHandleInvalid("error"), categories.where("color IS NOT NULL"), tmp_path,
                        ["color", "size"])
    with pytest.raises(ValueError, match="column 'color' has the unseen label 'violet'"):
        kernel.fn({"color": np.array(["red", "violet"], object), "size": np.array(["m", "m"], object)})


@pytest.mark.parametrize("drop_last,invalid", [(True, "error"), (False, "error"), (True, "keep"), (False, "keep")])
def test_one_hot_encoder(spark, categories, tmp_path, drop_last, invalid):
    fitted = F.OneHotEncoder(inputCols=["level", "b"], outputCols=["lv", "bv"], dropLast=drop_last,
                             handleInvalid=invalid).fit(categories.where("NOT isnan(b)"))
    df = categories.where("NOT isnan(b)").select("level", "b")
    if invalid == "keep":
        df = df.unionByName(spark.createDataFrame([(7.0, 2.0), (1.0, 9.0)], "level double, b double"))
    kernel, out, rows = _run(fitted, df, tmp_path, ["level", "b"])
    _check(out["lv"], [r.lv for r in rows])
    _check(out["bv"], [r.bv for r in rows])
    if invalid == "error":
        with pytest.raises(ValueError, match="column 'level' has an unseen value 7.0"):
            kernel.fn({"level": np.array([1.0, 7.0]), "b": np.array([0.0, 1.0])})


@pytest.mark.parametrize("strategy,missing", [("mean", None), ("median", None), ("mode", -1.0)])
def test_imputer(spark, categories, tmp_path, strategy, missing):
    df = categories.select("a", "b")
    if missing is not None:
        df = df.selectExpr("IF(a < -0.5, -1.0, a) AS a", "IF(isnan(b), -1.0, b) AS b")
    imputer = F.Imputer(inputCols=["a", "b"], outputCols=["ai", "bi"], strategy=strategy)
    if missing is not None:
        imputer.setMissingValue(missing)
    _, out, rows = _run(imputer.fit(df), df, tmp_path, ["a", "b"])
    _check(out["ai"], [r.ai for r in rows])
    _check(out["bi"], [r.bi for r in rows])


def test_vector_assembler_handle_invalid(spark, categories, tmp_path):
    df = categories.select("level", "a")
    stage = F.VectorAssembler(inputCols=["level", "a"], outputCol="v", handleInvalid="keep")
    _, out, rows = _run(stage, df, tmp_path, ["level", "a"])
    np.testing.assert_array_equal(out["v"].values, [r.v.toArray() for r in rows])
    kernel, out, rows = _run(stage.setHandleInvalid("skip"), df, tmp_path, ["level", "a"])
    assert kernel.drops_rows and out["v"].valid.sum() == len(rows)
    kernel, _, _ = _run(stage.setHandleInvalid("error"), df.where("a IS NOT NULL"), tmp_path, ["level", "a"])
    with pytest.raises(ValueError, match="column 'a' has a null or NaN at row 1"):
        kernel.fn({"level": np.array([1.0, 2.0]), "a": np.array([0.5, np.nan])})


# -- predictors -------------------------------------------------------------------------------------
def _check_predictor(model, df, tmp_path, columns=("rawPrediction", "probability", "prediction")):
    _, out, rows = _run(model, df, tmp_path, ["features"])
    for column in columns:
        _check(out[column], [r[column] for r in rows], exact=column == "prediction")


def test_logistic_regression_binary_with_thresholds(digits, tmp_path):
    model = C.LogisticRegression(labelCol="binary", maxIter=20, regParam=0.01, thresholds=[0.7, 0.3]).fit(digits)
    _check_predictor(model, digits, tmp_path)


def test_logistic_regression_multinomial_with_thresholds(digits, tmp_path):
    model = C.LogisticRegression(maxIter=20, regParam=0.01, elasticNetParam=0.5).fit(digits)
    _check_predictor(model.setThresholds([0.5] + [1.0] * 9), digits, tmp_path)


def test_linear_regression(digits, tmp_path):
    model = R.LinearRegression(labelCol="target", regParam=0.1, predictionCol="yhat").fit(digits)
    _check_predictor(model, digits, tmp_path, ["yhat"])


def test_multilayer_perceptron(digits, tmp_path):
    model = C.MultilayerPerceptronClassifier(layers=[64, 12, 10], maxIter=30, seed=1).fit(digits)
    _check_predictor(model, digits, tmp_path)


TREES = [
    (C.DecisionTreeClassifier, {"maxDepth": 4}, "label"),
    (C.RandomForestClassifier, {"numTrees": 5, "maxDepth": 4, "seed": 1}, "label"),
    (C.GBTClassifier, {"maxIter": 4, "maxDepth": 3, "seed": 1}, "binary"),
    (R.DecisionTreeRegressor, {"maxDepth": 4}, "target"),
    (R.RandomForestRegressor, {"numTrees": 5, "maxDepth": 4, "seed": 1}, "target"),
    (R.GBTRegressor, {"maxIter": 4, "maxDepth": 3, "seed": 1}, "target"),
]


@pytest.fixture(scope="module")
def indexed(digits):
    """VectorIndexer marks the features with few values categorical: the trees split on categories too."""
    indexer = F.VectorIndexer(inputCol="mixed", outputCol="indexed", maxCategories=4).fit(digits)
    return indexer.transform(digits).selectExpr("indexed AS features", "label", "binary", "target").cache()


@pytest.mark.parametrize("estimator,kwargs,label", TREES, ids=[e.__name__ for e, _, _ in TREES])
def test_trees_with_categorical_and_continuous_splits(indexed, tmp_path, estimator, kwargs, label):
    df = indexed.select("features", label)
    model = estimator(labelCol=label, **kwargs).fit(df)
    classifier = "Classif" in type(model).__name__
    _check_predictor(model, df, tmp_path, ["rawPrediction", "probability", "prediction"] if classifier
                     else ["prediction"])
    nodes = [r.get("nodeData", r) for r in read_stage(str(tmp_path / type(model).__name__)).tables["data"]]
    assert any(n["split"]["numCategories"] >= 0 and n["leftChild"] >= 0 for n in nodes)


# -- a chain, live stages, stages without kernels -------------------------------------------------
def test_saved_pipeline_stages_chain_equals_the_pipeline(categories, tmp_path):
    df = categories.where("color IS NOT NULL AND NOT isnan(b)")
    pipeline = Pipeline(stages=[
        F.StringIndexer(inputCols=["color", "size"], outputCols=["ci", "si"]),
        F.OneHotEncoder(inputCols=["ci", "si"], outputCols=["cv", "sv"]),
        F.Imputer(inputCols=["a"], outputCols=["ai"]),
        F.VectorAssembler(inputCols=["cv", "sv", "ai", "b"], outputCol="features"),
        C.LogisticRegression(labelCol="level", maxIter=10)]).fit(df)
    pipeline.write().overwrite().save(str(tmp_path / "pipe"))
    folders = sorted((tmp_path / "pipe" / "stages").iterdir())
    kernels = [load_sparkml_kernel(str(f)) for f in folders]
    rows = df.collect()
    blocks = {c: _block([r[c] for r in rows]) for c in ("color", "size", "a", "b")}
    out = run_steps([(k.inputs, k.fn) for k in kernels], blocks)
    expected = pipeline.transform(df).collect()
    _check(out["probability"], [r.probability for r in expected])
    _check(out["prediction"], [r.prediction for r in expected], exact=True)
    # The live stages give the same kernels (Imputer has none live: PySpark keeps its surrogates in Spark).
    live = [sparkml_kernel(s) or k for s, k in zip(pipeline.stages, kernels)]
    assert [s is None for s in map(sparkml_kernel, pipeline.stages)] == [False, False, True, False, False]
    again = run_steps([(k.inputs, k.fn) for k in live], blocks)
    np.testing.assert_array_equal(again["probability"].values, out["probability"].values)


def test_live_stages_give_the_same_kernel(digits):
    model = F.StandardScaler(inputCol="features", outputCol="scaled", withMean=True).fit(digits)
    rows = model.transform(digits).collect()
    out = sparkml_kernel(model).fn({"features": _block([r.features for r in rows])})
    _check(out["scaled"], [r.scaled for r in rows])


def test_a_stage_without_a_kernel_is_named(digits, tmp_path):
    F.PCA(k=2, inputCol="features", outputCol="pca").fit(digits).save(str(tmp_path / "pca"))
    with pytest.raises(NoKernelError, match="SparkML stage PCAModel has no kernel"):
        load_sparkml_kernel(str(tmp_path / "pca"))


def test_a_vector_of_the_wrong_size_is_refused(digits, tmp_path):
    F.MinMaxScaler(inputCol="features", outputCol="scaled").fit(digits).save(str(tmp_path / "mm"))
    kernel = load_sparkml_kernel(str(tmp_path / "mm"))
    with pytest.raises(ValueError, match="'features' holds vectors of size 3, the fitted stage expects size 64"):
        kernel.fn({"features": Tensor(np.zeros((2, 3)), np.ones(2, bool))})
