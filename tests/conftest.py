"""Shared fixtures: one local Spark session per test run, created on first use."""

from __future__ import annotations

import contextlib
import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Keep torch and BLAS to the cores the tests own; Spark workers get their own settings.
os.environ.setdefault("OMP_NUM_THREADS", "2")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CONNECT_PORT = _free_port()


@pytest.fixture(scope="session")
def spark():
    """The test run's Spark session: local[2], UI off, few shuffle partitions.

    Its context also serves Spark Connect on a free loopback port (the ``connect`` fixture), so
    classic and Connect tests share one JVM.
    """
    from irbis.spark.session import get_spark

    session = get_spark(
        "local[2]",
        app_name="irbis-tests",
        **{
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "3g",
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(CONNECT_PORT),
        },
    )
    yield session
    session.stop()


@contextlib.contextmanager
def connect_mode():
    """Run a block as a Spark Connect client process would (PySpark's functions build Connect columns).

    PySpark decides between classic and Connect columns by one process-wide flag; the tests hold a
    classic and a Connect session in one process, so Connect code runs inside this block only.
    """
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    try:
        yield
    finally:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.fixture(scope="session")
def connect(spark):
    """A Spark Connect session (``sc://``) served by the test run's Spark context; use it inside
    ``connect_mode()``."""
    from irbis.spark.session import get_spark

    with connect_mode():
        session = get_spark(f"sc://127.0.0.1:{CONNECT_PORT}")
    yield session
    with connect_mode():
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
