"""get_spark: defaults, reuse, and a clear error for a second master."""

import pytest

from irbis.spark.session import get_spark

pytestmark = pytest.mark.spark


def test_get_spark_reuses_the_session_and_enables_arrow(spark):
    assert get_spark("local[2]") is spark
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"


def test_get_spark_refuses_a_different_master_while_one_runs(spark):
    with pytest.raises(RuntimeError, match="already running.*spark.stop"):
        get_spark("local-cluster[2,1,1024]")
