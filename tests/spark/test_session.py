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


_SUBMITTED = """
import json
import irbis
spark = irbis.get_spark()
conf = spark.sparkContext.getConf()
print("SESSION " + json.dumps({"master": spark.sparkContext.master, "name": conf.get("spark.app.name"),
                               "arrow": conf.get("spark.sql.execution.arrow.pyspark.enabled"),
                               "records": conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"),
                               "rows": spark.range(5).count()}))
spark.stop()
"""


@pytest.mark.classic_only(reason="runs spark-submit, a classic application of its own")
def test_get_spark_in_a_script_spark_submit_started_keeps_its_master_and_settings(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from pyspark.find_spark_home import _find_spark_home

    script = tmp_path / "job.py"
    script.write_text(_SUBMITTED)
    submit = os.path.join(_find_spark_home(), "bin", "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run([submit, "--master", "local[1]", "--name", "submitted-job",
                           "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=512", str(script)],
                          capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("SESSION "))
    seen = json.loads(line.removeprefix("SESSION "))
    assert seen["master"] == "local[1]" and seen["name"] == "submitted-job"  # spark-submit's, not local[*]
    assert seen["records"] == "512"  # its settings win over Irbis's defaults (4096)
    assert seen["arrow"] == "true"  # Irbis's defaults fill in what it did not set
    assert seen["rows"] == 5
