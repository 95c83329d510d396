"""TextFeaturizer against the chain of SparkML stages it replaces."""
import numpy as np
import pytest
from pyspark.ml import Pipeline
from pyspark.ml.feature import IDF, HashingTF, NGram, RegexTokenizer, StopWordsRemover
from pyspark.ml.linalg import SparseVector

from irbis.ml.text import TextFeaturizer

pytestmark = pytest.mark.spark
DOCS = ["The quick brown fox", "jumps over the lazy dog, the end", "Ünïcode façade 東京 fox", "fox fox"]


@pytest.fixture(scope="module")
def texts(spark):
    return spark.createDataFrame([(i, t) for i, t in enumerate(DOCS)], "id int, t string")


def test_same_vectors_as_the_sparkml_chain(texts):
    chain = Pipeline(stages=[
        RegexTokenizer(inputCol="t", outputCol="tok", pattern=r"\W+"),
        StopWordsRemover(inputCol="tok", outputCol="clean"),
        NGram(inputCol="clean", outputCol="grams", n=2),
        HashingTF(inputCol="grams", outputCol="tf", numFeatures=128),
        IDF(inputCol="tf", outputCol="ref", minDocFreq=1),
    ]).fit(texts).transform(texts)
    model = TextFeaturizer(inputCol="t", outputCol="f", tokenizerPattern=r"\W+", useStopWordsRemover=True,
                           useNGram=True, numFeatures=128).fit(texts)
    ours = model.transform(texts).join(chain.select("id", "ref"), "id").orderBy("id").collect()
    for row in ours:
        np.testing.assert_allclose(row.f.toArray(), row.ref.toArray())
    assert any(row.f.numNonzeros() for row in ours)


def test_pandas_path_gives_the_spark_vectors_and_nulls_are_empty(spark, texts):
    df = texts.union(spark.createDataFrame([(9, None)], "id int, t string"))
    model = TextFeaturizer(inputCol="t", outputCol="f", numFeatures=1 << 12, binary=True).fit(df)
    spark_rows = [r.f.toArray() for r in model.transform(df).orderBy("id").collect()]
    local = model.transform(df.toPandas().sort_values("id"))
    for ours, theirs in zip(local["f"], spark_rows):
        assert isinstance(ours, SparseVector) and ours.size == 1 << 12
        np.testing.assert_allclose(ours.toArray(), theirs)
    assert not spark_rows[-1].any()


def test_bad_params_and_types_are_named(texts):
    with pytest.raises(ValueError, match="numFeatures"):
        TextFeaturizer(inputCol="t", outputCol="f", numFeatures=0)
    with pytest.raises(TypeError, match="'id'.*string"):
        TextFeaturizer(inputCol="id", outputCol="f").fit(texts)
