"""Small reshaping stages and Lambda's persistence by reference."""
import pytest
from pyspark.sql import functions as F

from irbis.ml.basic import Cache, DropColumns, Lambda, RenameColumn, Repartition, SelectColumns

pytestmark = pytest.mark.spark


def test_reshaping_stages(spark):
    df = spark.createDataFrame([(1, "a", 2.0)], "i int, s string, x double")
    spread = Repartition(numPartitions=3).transform(spark.range(30)).select(F.spark_partition_id().alias("p"))
    assert spread.distinct().count() == 3
    assert SelectColumns(cols=["x", "i"]).transform(df).columns == ["x", "i"]
    assert DropColumns(cols=["s"]).transform(df).columns == ["i", "x"]
    assert RenameColumn(inputCol="s", outputCol="t").transform(df).columns == ["i", "t", "x"]
    cached = Cache().transform(df)
    assert cached.storageLevel.useDisk and cached.collect() == df.collect()
    cached.unpersist()
    with pytest.raises(ValueError, match="'zz'"):
        DropColumns(cols=["zz"]).transform(df)
    with pytest.raises(ValueError, match="already exists"):
        RenameColumn(inputCol="s", outputCol="x").transform(df)
    with pytest.raises(ValueError, match="storageLevel"):
        Cache(storageLevel="FAST")


def test_lambda_saves_by_reference_and_refuses_what_it_cannot(spark, tmp_path):
    df = spark.createDataFrame([(1, "a")], "i int, s string")
    stage = Lambda(function="irbis.kernels.assemble:check_handle_invalid")
    assert stage.getOrDefault("function") == "irbis.kernels.assemble:check_handle_invalid"
    assert stage._call("keep") == "keep"
    by_object = Lambda(function=_drop_s)
    by_object.save(str(tmp_path / "ok"))
    assert Lambda.load(str(tmp_path / "ok")).transform(df).columns == ["i"]

    def closure(frame):
        return frame

    for fn, reason in [(lambda f: f, "lambda"), (closure, "closure")]:
        unsaved = Lambda(function=fn)
        assert unsaved.transform(df).columns == ["i", "s"]
        with pytest.raises(ValueError, match=reason):
            unsaved.save(str(tmp_path / "no"))
    with pytest.raises(TypeError, match="callable"):
        Lambda(function=3)


def _drop_s(frame):
    return frame.drop("s")
