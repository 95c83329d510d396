"""Shared fixtures: one local Spark session per test run, created on first use."""

from __future__ import annotations

import os

import pytest

from background import Background
from connect_mode import connect_mode
from irbis.spark.standalone import free_port

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Keep torch and BLAS to the cores the tests own; Spark workers get their own settings.
os.environ.setdefault("OMP_NUM_THREADS", "2")


CONNECT_PORT = free_port()
#: The Java options of the JVMs the tests start (see :func:`pytest_configure`); the standalone cluster's
#: executors take them too (``tests/cluster/cluster_checks.py``).
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def pytest_addoption(parser):
    parser.addoption("--connect", action="store_true",
                     help="run the Spark tests only, each on a Spark Connect session (sc://) instead of classic Spark")
    parser.addoption("--device", choices=("cpu", "cuda"), default="cpu",
                     help="the device the tests that take the device fixture run on (make gpu-check gives cuda)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "classic_only(reason): needs the classic PySpark API (sparkContext, a session of its own); "
                   "skipped under --connect with the reason given")
    config.addinivalue_line(
        "markers", "device: takes the device fixture (given automatically): runs on pytest --device, the CPU by "
                   "default; -m device selects them")
    # Every JVM the run starts through spark-submit (the session's, the notebooks' drivers, the subprocess
    # drivers) compiles with the client compiler only: the test jobs are many and small, and the server
    # compiler's work on them cost more CPU than it saved (a third of a Spark test file's CPU time on 2 cores).
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), TEST_JVM_OPTIONS]))
    if config.getoption("--device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")


@pytest.fixture(scope="session")
def device(request) -> str:
    """The device of ``pytest --device`` (``cpu`` by default, ``cuda`` in ``make gpu-check``). A device that
    is not there stops the run (:func:`pytest_configure`), never a quiet fall-back to the CPU. The tests that
    take it also run where Spark is not installed (the lent GPU machine has none): their files import no
    pyspark."""
    return request.config.getoption("--device")


def on_connect(config) -> bool:
    """Whether this run puts every Spark test on Spark Connect (``pytest --connect``)."""
    return bool(config.getoption("--connect"))


@pytest.fixture(scope="session")
def spark(request):
    """The test run's Spark session: local[2], UI off, few shuffle partitions.

    Its context also serves Spark Connect on a free loopback port (the ``connect`` fixture), so
    classic and Connect tests share one JVM. With ``pytest --connect`` the fixture gives the Connect
    session instead, and the whole run is a Connect client: every Spark test runs on Connect (those
    marked ``classic_only`` are skipped, and the tests without Spark are left out).
    """
    from irbis.spark.session import get_spark

    classic = get_spark(
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
            "spark.connect.progress.reportInterval": "100ms",  # progress bars see short test jobs too
        },
    )
    if not on_connect(request.config):
        yield classic
        classic.stop()
        return
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    remote = get_spark(f"sc://127.0.0.1:{CONNECT_PORT}")
    yield remote
    remote.stop()
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    classic.stop()


@pytest.fixture(scope="session")
def connect(spark):
    """A Spark Connect session (``sc://``) served by the test run's Spark context; use it inside
    ``connect_mode()``."""
    from irbis.spark.session import get_spark

    if spark.__class__.__module__.startswith("pyspark.sql.connect"):
        yield spark  # pytest --connect: the run's session is already the Connect one
        return
    with connect_mode():
        session = get_spark(f"sc://127.0.0.1:{CONNECT_PORT}")
    _CONNECT_CLIENTS.append(session)
    yield session
    _stop_connect_clients()


#: Connect client sessions of this run, stopped before the JVM that serves them goes away.
_CONNECT_CLIENTS: list = []


def _stop_connect_clients() -> None:
    """Stop the Connect clients while their server still runs (a client of a stopped server would
    retry its release for minutes)."""
    while _CONNECT_CLIENTS:
        with connect_mode():
            _CONNECT_CLIENTS.pop().stop()


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


@pytest.fixture(scope="session")
def camera_trap_run(tmp_path_factory):
    """One run of ``examples/notebooks/camera_trap.py`` as a user runs it (:func:`notebook_runner.run_notebook`):
    ``(notebook, seconds, folder)``, ``folder`` its working folder, where the notebook's ``run_demo`` wrote
    ``camera-trap-output``. The notebook's test checks what it shows, ``tests/spark/test_demo.py`` the demo's
    results and files (:func:`irbis.demo.camera_trap.load_demo`): the ladder is climbed once for both (so
    ``-m "not notebooks"`` still runs this notebook when ``test_demo.py`` runs on the classic session).
    Started at collection where the run holds such a test (:func:`pytest_collection_finish`): the notebook
    has a kernel and a Spark driver of its own, so it runs beside the tests before them."""
    if not _CAMERA_TRAP:
        _CAMERA_TRAP.append(_camera_trap(tmp_path_factory))
    return _CAMERA_TRAP[0].result(timeout_s=1800)


def _camera_trap(tmp_path_factory) -> Background:
    from notebook_runner import NOTEBOOKS, run_notebook

    folder = tmp_path_factory.mktemp("camera_trap_notebook")
    return Background("camera-trap notebook", lambda: (*run_notebook(NOTEBOOKS / "camera_trap.py", folder), folder))


#: The camera-trap notebook's run, started at collection (:func:`pytest_collection_finish`).
_CAMERA_TRAP: list[Background] = []


def _needs_camera_trap(item) -> bool:
    """Whether ``item`` reads the camera-trap notebook's run: the demo's tests and the notebook's own."""
    return item.nodeid.startswith("tests/spark/test_demo.py") or (
        item.nodeid.startswith("tests/notebooks/") and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("name") == "camera_trap")


def pytest_collection_finish(session):
    """Start the camera-trap notebook as soon as the run is known to read it (not under ``--connect``, which
    skips its readers)."""
    config = session.config
    if config.option.collectonly or on_connect(config) or _CAMERA_TRAP:
        return
    if any(_needs_camera_trap(item) and not item.get_closest_marker("skip") for item in session.items):
        _CAMERA_TRAP.append(_camera_trap(config._tmp_path_factory))


def uses_spark(item) -> bool:
    """Whether a test runs on the test run's Spark session: it takes the ``spark`` fixture, directly or
    through another fixture. What folder it lies in does not count: a test of ``tests/spark`` that starts no
    session (a Param's range, an export, a fresh interpreter) gains nothing from a second run on Connect."""
    return "spark" in getattr(item, "fixturenames", ())


def compares_with_connect(item) -> bool:
    """Whether a test takes the ``connect`` fixture: it holds the classic session and a Connect client of the
    same server side by side and compares them. The classic run does that once; under ``--connect`` both
    sides would be the Connect session, a comparison that cannot fail, so it is skipped there."""
    return "connect" in getattr(item, "fixturenames", ())


def run_order(item) -> int:
    """0 for the ordinary tests; 1 for the ``cluster`` ones (a standalone cluster beside the local session,
    stopped after them: they run after the ordinary tests so that the PEX they ship is built while those run,
    see ``tests/cluster/conftest.py``); 2 for the slow ones on the local session; 3 for the ``notebooks``
    (each runs in a kernel process with a Spark driver of its own, so they run as a group after every other
    test on the local session); 4 for those on ``cluster_spark``, which stops the local session: every test
    that needs it must run before."""
    if "cluster_spark" in getattr(item, "fixturenames", ()):
        return 4
    if item.get_closest_marker("notebooks") is not None:
        return 3
    if item.get_closest_marker("slow") is not None:
        return 2
    return 1 if item.get_closest_marker("cluster") is not None else 0


def pytest_collection_modifyitems(config, items):
    """Run the slow multi-executor tests last: they replace the local session with a cluster; skip the
    ``gpu`` tests where torch sees no CUDA device.

    Under ``--connect`` only the Spark tests run (:func:`uses_spark`; the others, the notebooks among them,
    gain nothing from a second run), and the multi-executor tests, the ``cluster`` ones and the
    ``classic_only`` ones are skipped: the first two start classic clusters and drivers of their own, the
    last say why they need classic Spark. The tests that compare classic Spark with Connect
    (:func:`compares_with_connect`) are skipped there too: the classic run makes each comparison once.
    """
    if on_connect(config):
        kept = [item for item in items if uses_spark(item)]
        dropped = [item for item in items if not uses_spark(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    items.sort(key=run_order)
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.device)
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
            for item in gpu:
                item.add_marker(skip)
    if on_connect(config):
        cluster = pytest.mark.skip(reason="starts a classic local-cluster of its own")
        standalone = pytest.mark.skip(reason="starts a standalone cluster and classic drivers of its own")
        for item in items:
            if "cluster_spark" in getattr(item, "fixturenames", ()):
                item.add_marker(cluster)
            elif item.get_closest_marker("cluster") is not None:
                item.add_marker(standalone)
            elif compares_with_connect(item):
                item.add_marker(pytest.mark.skip(reason="compares classic Spark with Connect: the classic run does, "
                                                        "here both sides would be Connect"))
            elif (marker := item.get_closest_marker("classic_only")) is not None:
                reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "needs classic Spark")
                item.add_marker(pytest.mark.skip(reason=f"classic only: {reason}"))


#: A GPU discovery script for the cluster session's workers: the first worker to run it advertises GPU "0",
#: the other GPU "1" (fake addresses: the tests that read them never touch CUDA).
FAKE_GPUS = """#!/bin/sh
if mkdir "{folder}/first" 2>/dev/null; then echo '{{"name": "gpu", "addresses": ["0"]}}'
else echo '{{"name": "gpu", "addresses": ["1"]}}'; fi
"""


@pytest.fixture(scope="session")
def cluster_spark(tmp_path_factory):
    """A ``local-cluster[2,1,1024]`` session: two real executor JVMs with one core each, each worker with one
    fake GPU that Spark assigns to every task (``spark.task.resource.gpu.amount`` 1), as on a GPU cluster; the
    stages on it run on ``device="cpu"``, which takes no GPU.

    Only one SparkContext can live in a process, so this stops the local session; the tests on it run
    last (see ``pytest_collection_modifyitems``) and are the only users of this fixture.
    """
    from pyspark.sql import SparkSession

    from irbis.spark.session import get_spark

    folder = tmp_path_factory.mktemp("fake-gpus")
    script = folder / "discover.sh"
    script.write_text(FAKE_GPUS.format(folder=folder))
    script.chmod(0o755)
    _stop_connect_clients()
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    session = get_spark(
        "local-cluster[2,1,1024]",
        app_name="irbis-cluster-tests",
        **{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
           "spark.worker.resource.gpu.amount": "1", "spark.worker.resource.gpu.discoveryScript": str(script),
           "spark.executor.resource.gpu.amount": "1", "spark.task.resource.gpu.amount": "1"},
    )
    yield session
    session.stop()
