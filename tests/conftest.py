"""Shared fixtures: one local Spark session per test run, created on first use."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Keep torch and BLAS to the cores the tests own; Spark workers get their own settings.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def spark():
    """The test run's Spark session: local[2], UI off, few shuffle partitions."""
    from irbis.spark.session import get_spark

    session = get_spark(
        "local[2]",
        app_name="irbis-tests",
        **{
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "3g",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tiny_images(tmp_path_factory):
    """Real photographs shipped with scikit-image and scikit-learn, written as small JPEG files."""
    import cv2
    from skimage import data

    folder = tmp_path_factory.mktemp("photos")
    photos = {"chelsea": data.chelsea(), "coffee": data.coffee(), "rocket": data.rocket()}
    paths = {}
    for name, rgb in photos.items():
        path = folder / f"{name}.jpg"
        cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        paths[name] = path
    return paths


def pytest_collection_modifyitems(config, items):
    """Run the slow multi-executor tests last: they replace the local session with a cluster."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)


@pytest.fixture(scope="session")
def cluster_spark():
    """A ``local-cluster[2,1,1024]`` session: two real executor JVMs with one core each.

    Only one SparkContext can live in a process, so this stops the local session; slow tests run
    last (see ``pytest_collection_modifyitems``) and are the only users of this fixture.
    """
    from pyspark.sql import SparkSession

    from irbis.spark.session import get_spark

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    session = get_spark(
        "local-cluster[2,1,1024]",
        app_name="irbis-cluster-tests",
        **{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    yield session
    session.stop()
