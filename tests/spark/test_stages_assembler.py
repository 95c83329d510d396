"""FastVectorAssembler against SparkML's VectorAssembler."""
import numpy as np
import pytest
from pyspark.ml.feature import StringIndexer, VectorAssembler, VectorSizeHint
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType

from irbis.ml.assembler import FastVectorAssembler

pytestmark = pytest.mark.spark
COLS = ["a", "b", "v", "si"]


@pytest.fixture(scope="module")
def frame(spark):
    schema = StructType([StructField("a", DoubleType()), StructField("b", IntegerType()),
                         StructField("v", VectorUDT()), StructField("s", StringType())])
    rows = [(1.0, 2, Vectors.dense([1.0, np.nan]), "p"), (float("nan"), None, None, "q"),
            (3.0, 4, Vectors.sparse(2, [0], [5.0]), "p")]
    df = spark.createDataFrame(rows, schema)
    df = StringIndexer(inputCol="s", outputCol="si").fit(df).transform(df)
    return VectorSizeHint(inputCol="v", size=2, handleInvalid="optimistic").transform(df)


def _values(df):
    return [r.f.toArray().tolist() for r in df.orderBy("s", "b").collect()]


@pytest.mark.parametrize("mode", ["keep", "skip"])
@pytest.mark.parametrize("shuffled", [False, True])
def test_same_values_and_metadata_as_vector_assembler(frame, mode, shuffled):
    df = frame.repartition(2) if shuffled else frame  # a shuffle takes the array_to_vector path
    ours = FastVectorAssembler(inputCols=COLS, outputCol="f", handleInvalid=mode).transform(df)
    theirs = VectorAssembler(inputCols=COLS, outputCol="f", handleInvalid=mode).transform(df)
    np.testing.assert_array_equal(np.array(_values(ours)), np.array(_values(theirs)))
    assert ours.schema["f"].metadata == theirs.schema["f"].metadata
    assert ours.schema["f"].metadata["ml_attr"]["attrs"]["nominal"][0]["vals"] == ["p", "q"]


def test_error_mode_names_the_column(frame):
    out = FastVectorAssembler(inputCols=["a", "v"], outputCol="f").transform(frame)
    with pytest.raises(Exception, match="null or NaN value in column 'a'"):
        out.collect()


def test_pandas_path_matches_spark(frame):
    stage = FastVectorAssembler(inputCols=["a", "b", "v"], outputCol="f", handleInvalid="skip")
    spark_rows = _values(stage.transform(frame))
    pdf = frame.toPandas()
    pdf["v"] = [None if v is None else v.toArray() for v in pdf["v"]]
    local = stage.transform(pdf.sort_values(["s", "b"]))
    np.testing.assert_array_equal(np.stack(local["f"]), np.array(spark_rows))
