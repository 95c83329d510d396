"""Featurize in Spark: the same plan as on pandas, named slots, bad input."""
import datetime as dt

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from irbis.ml.featurize import Featurize

pytestmark = pytest.mark.spark
SCHEMA = StructType([StructField("n", DoubleType()), StructField("b", BooleanType()), StructField("s", StringType()),
                     StructField("v", VectorUDT()), StructField("d", DateType()), StructField("ts", TimestampType())])
ROWS = [(1.0, True, "red", Vectors.dense([1.0, 2.0]), dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 10)),
        (None, False, "blue", None, dt.date(2024, 1, 3), None),
        (float("nan"), None, None, Vectors.dense([3.0, 4.0]), None, dt.datetime(2024, 1, 1, 12))]


@pytest.fixture(scope="module")
def frame(spark):
    return spark.createDataFrame(ROWS, SCHEMA)


def test_spark_and_pandas_fit_the_same_plan_and_vectors(frame):
    stage = Featurize(inputCols=SCHEMA.fieldNames(), outputCol="x")
    model = stage.fit(frame)
    local = stage.fit(frame.toPandas())
    assert model._plans == local._plans
    out = model.transform(frame)
    names = [a["name"] for a in out.schema["x"].metadata["ml_attr"]["attrs"]["numeric"]]
    assert names == model.feature_names and "s=__other__" in names and "ts_missing" in names
    second = dict(zip(names, out.collect()[1].x.toArray()))
    assert second["n"] == 1.0 and second["n_missing"] == 1.0 and second["s=blue"] == 1.0
    assert second["v_0"] == 2.0 and second["ts_hour"] == 11.0 and second["ts_missing"] == 1.0


def test_unseen_category_and_retyped_column(spark, frame):
    model = Featurize(inputCols=["s"], outputCol="x", maxCategories=5).fit(frame)
    new = spark.createDataFrame([("green",)], "s string")
    assert model.transform(new).first().x.toArray().tolist() == [0.0, 0.0, 1.0, 0.0]
    with pytest.raises(TypeError, match="'s'"):
        model.transform(spark.createDataFrame([(1.0,)], "s double"))


def test_high_cardinality_strings_are_hashed_and_maps_refused(spark, frame):
    model = Featurize(inputCols=["s"], outputCol="x", maxCategories=1, numHashBuckets=8).fit(frame)
    assert model._plans[0]["kind"] == "hashed" and len(model.feature_names) == 9
    bad = spark.createDataFrame([({"a": 1.0},)], StructType([StructField("m", MapType(StringType(), DoubleType()))]))
    with pytest.raises(TypeError, match="'m'"):
        Featurize(inputCols=["m"], outputCol="x").fit(bad)
    assert np.isfinite(model.transform(frame).first().x.toArray()).all()


def _by_id(rows):
    return {r.id: np.asarray(r.x.toArray() if hasattr(r.x, "toArray") else r.x).tolist() for r in rows}


@pytest.mark.parametrize("local", [False, True], ids=["spark", "pandas"])
def test_without_imputation_a_missing_number_is_kept_as_nan_or_its_row_skipped(spark, frame, tmp_path, local):
    """imputeMissing=False: a missing number (null or NaN) is left missing and unflagged, and
    vectorAssemblerHandleInvalid keeps its row with NaN or drops the row; the other kinds are imputed as before."""
    data = spark.createDataFrame([(i, *row) for i, row in enumerate(ROWS)],
                                 StructType([StructField("id", IntegerType()), *SCHEMA.fields]))
    data = data.toPandas() if local else data
    cols = ["n", "b", "s", "d"]
    keep = Featurize(inputCols=cols, outputCol="x", imputeMissing=False, vectorAssemblerHandleInvalid="keep")
    model = keep.fit(data)
    assert "n_missing" not in model.feature_names and "b_missing" in model.feature_names
    rows = _by_id(model.transform(data).itertuples() if local else model.transform(data).collect())
    assert set(rows) == {0, 1, 2} and rows[0][0] == 1.0
    assert np.isnan(rows[1][0]) and np.isnan(rows[2][0])  # null and NaN alike
    assert rows[2][model.feature_names.index("b")] == 0.5  # a missing boolean is still imputed
    model.write().overwrite().save(str(tmp_path / "keep"))
    loaded = type(model).load(str(tmp_path / "keep"))
    assert loaded.getImputeMissing() is False and loaded._plans == model._plans
    skipped = loaded.copy({loaded.vectorAssemblerHandleInvalid: "skip"}).transform(data)
    assert set(_by_id(skipped.itertuples() if local else skipped.collect())) == {0}
    imputed = Featurize(inputCols=cols, outputCol="x").fit(data).transform(data)
    assert (len(imputed) if local else imputed.count()) == 3


def test_without_imputation_error_fails_naming_the_column(frame):
    model = Featurize(inputCols=["n", "s"], outputCol="x", imputeMissing=False).fit(frame)
    assert model.getVectorAssemblerHandleInvalid() == "error"
    with pytest.raises(Exception, match="column 'n' has a missing value"):
        model.transform(frame).collect()
    with pytest.raises(ValueError, match="column 'n' has a missing value.*vectorAssemblerHandleInvalid"):
        model.transform(frame.toPandas())
    present = frame.where("n = 1.0")
    assert model.transform(present).first().x.toArray()[0] == 1.0
