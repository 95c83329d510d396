"""get_spark: defaults, reuse, and a clear error for a second master."""

import pytest

from irbis.spark.session import get_spark

pytestmark = pytest.mark.spark


@pytest.mark.classic_only(reason="get_spark's classic session: PySpark gives a Spark Connect client process none")
def test_get_spark_reuses_the_session_and_enables_arrow(spark):
    assert get_spark("local[2]") is spark
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"


@pytest.mark.classic_only(reason="get_spark's classic session: PySpark gives a Spark Connect client process none")
def test_get_spark_refuses_a_different_master_while_one_runs(spark):
    with pytest.raises(RuntimeError, match="already running.*spark.stop"):
        get_spark("local-cluster[2,1,1024]")


@pytest.mark.classic_only(reason="a local master's Python workers get spark.executorEnv.* from the classic "
                                 "client's UDF environment only; a Connect client sends none")
def test_python_workers_get_huge_pages_for_malloc(spark):
    """The engines free their buffers after each call only where malloc gives huge pages."""
    import os

    from pyspark.sql.functions import udf

    from irbis.kernels.engines.exported import HUGE_PAGE_TUNABLE

    tunables = udf(lambda _: os.environ.get("GLIBC_TUNABLES", ""), "string")
    seen = spark.range(2).select(tunables("id").alias("t")).distinct().collect()
    assert [HUGE_PAGE_TUNABLE in row.t.split(":") for row in seen] == [True]


@pytest.mark.parametrize("given, expected", [
    (None, "glibc.malloc.hugetlb=1"),
    ("glibc.malloc.arena_max=2", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
    ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=0"),
])
def test_worker_environment_adds_huge_pages_to_the_tunables_given(monkeypatch, given, expected):
    from irbis.spark.session import worker_environment

    if given is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", given)
    assert worker_environment() == {"spark.executorEnv.GLIBC_TUNABLES": expected}
