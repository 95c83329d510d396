"""Featurize in Spark: the same plan as on pandas, named slots, bad input."""
import datetime as dt

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DoubleType,
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
