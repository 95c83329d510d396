"""EnsembleByKey in Spark: the pandas kernel's results, computed in the JVM."""
import numpy as np
import pytest
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from irbis.kernels.ensemble import ensemble_frame
from irbis.ml.ensemble_by_key import EnsembleByKey

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def frame(spark):
    schema = StructType([StructField("k", StringType()), StructField("x", DoubleType()), StructField("v", VectorUDT())])
    rows = [("a", 1.0, Vectors.dense([1.0, 2.0])), ("a", float("nan"), Vectors.dense([3.0, 6.0])),
            ("b", None, None), (None, 4.0, Vectors.sparse(2, [1], [-1.0])), ("a", 5.0, None)]
    return spark.createDataFrame(rows, schema)


def _as_dict(rows, key="k"):
    return {r[key]: tuple(None if v is None else tuple(np.asarray(v.toArray() if hasattr(v, "toArray") else v))
                          if not isinstance(v, float) else v for v in list(r)[1:]) for r in rows}


@pytest.mark.parametrize("strategy", ["mean", "max"])
def test_spark_matches_the_pandas_kernel(frame, strategy):
    stage = EnsembleByKey(keys=["k"], cols=["x", "v"], strategy=strategy)
    out = stage.transform(frame)
    assert out.columns == ["k", f"{strategy}(x)", f"{strategy}(v)"]
    pdf = frame.toPandas()
    pdf["v"] = [None if v is None else v.toArray() for v in pdf["v"]]
    expected = ensemble_frame(pdf, ["k"], ["x", "v"], strategy=strategy)
    got = {r.k: (r[1], None if r[2] is None else r[2].toArray().tolist()) for r in out.collect()}
    for _, row in expected.iterrows():
        k = row["k"]
        value, vec = got[k]
        ref = row[f"{strategy}(x)"]
        assert (value is None and (ref is None or np.isnan(ref))) or value == pytest.approx(ref)
        ref_vec = row[f"{strategy}(v)"]
        assert (vec is None and ref_vec is None) or vec == pytest.approx(list(ref_vec))
    assert got["a"][0] == (3.0 if strategy == "mean" else 5.0)  # NaN and null ignored
    assert got["b"] == (None, None)


def test_keep_rows_appends_group_values(frame):
    out = EnsembleByKey(keys=["k"], cols=["v"], colNames=["avg"], collapseGroup=False).transform(frame)
    rows = out.where("k = 'a'").collect()
    assert len(rows) == 3 and all(r.avg.toArray().tolist() == [2.0, 4.0] for r in rows)


def test_bad_input(frame, spark):
    with pytest.raises(ValueError, match="'nope'"):
        EnsembleByKey(keys=["nope"], cols=["x"]).transform(frame)
    with pytest.raises(TypeError, match="'k'"):
        EnsembleByKey(keys=["x"], cols=["k"]).transform(frame)
    with pytest.raises(ValueError, match="strategy"):
        EnsembleByKey(keys=["k"], cols=["x"], strategy="mode")
    schema = StructType([StructField("k", StringType()), StructField("v", VectorUDT())])
    bad = spark.createDataFrame([("a", Vectors.dense([1.0])), ("a", Vectors.dense([1.0, 2.0]))], schema)
    with pytest.raises(Exception, match="column 'v' holds vectors of different lengths"):
        EnsembleByKey(keys=["k"], cols=["v"]).transform(bad).collect()


def test_col_names_is_neither_set_nor_defaulted_until_the_user_sets_it(frame, tmp_path):
    """As SynapseML's: colNames has no default; the getter answers the derived names, before and after
    transform and after a save and load, and the saved stage records no colNames."""
    from irbis.kernels.sparkml.state import read_metadata

    stage = EnsembleByKey(keys=["k"], cols=["x"])

    def unset(s):
        return not s.isSet("colNames") and not s.hasDefault("colNames") and s.getColNames() == ["mean(x)"]

    assert unset(stage)
    assert stage.transform(frame).columns == ["k", "mean(x)"] and unset(stage)
    stage.write().overwrite().save(str(tmp_path / "e"))
    metadata = read_metadata(str(tmp_path / "e"))
    assert "colNames" not in metadata["paramMap"] and "colNames" not in metadata["defaultParamMap"]
    loaded = EnsembleByKey.load(str(tmp_path / "e"))
    assert unset(loaded) and loaded.transform(frame).columns == ["k", "mean(x)"]
    named = EnsembleByKey(keys=["k"], cols=["x"], colNames=["avg"])
    assert named.isSet("colNames") and named.getColNames() == ["avg"]
