"""A Spark standalone cluster of separate processes for the ``cluster`` tests: one master and two
workers (one core, 2 GB each) started with PySpark's own ``spark-class`` launcher on loopback, each
worker with its own work, local and temporary directories.

A Python process holds one SparkContext, and the test run's process keeps its local session, so the
cluster's driver is a process of its own: :func:`run_checks` starts ``cluster_checks.py`` against the
master and reads back what it wrote. Every process started here runs in a process group of its own,
killed at the end of the run whatever the tests did.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CHECKS = HERE / "cluster_checks.py"


def pytest_collection_modifyitems(config, items):
    """Skip the ``cluster`` tests under ``--connect``: they start classic drivers of their own."""
    if config.getoption("--connect"):
        skip = pytest.mark.skip(reason="starts a standalone cluster and classic drivers of its own")
        for item in items:
            if item.get_closest_marker("cluster") is not None:
                item.add_marker(skip)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop ``proc`` and every process of its group: SIGTERM, then SIGKILL after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
            os.killpg(proc.pid, 0)  # the leader is gone; anything left in the group?
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break


def wait_for_port(cluster: "Standalone", port: int, timeout_s: float) -> None:
    """Wait until the master accepts connections on ``port``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if cluster.procs[0].poll() is not None:
                break
            time.sleep(0.2)
    log = cluster.root / "master.log"
    raise RuntimeError(f"the master did not listen on port {port} within {timeout_s:.0f} s:\n"
                       f"{log.read_text(errors='replace')[-3000:] if log.exists() else ''}")


def wait_for_apps(cluster: "Standalone", count: int, timeout_s: float) -> dict:
    """Wait until the master's status page lists ``count`` running applications; return the page."""
    return wait_for_status(cluster, lambda page: len(page.get("activeapps", [])) >= count,
                           f"{count} applications did not start", timeout_s)


def wait_for_workers(cluster: "Standalone", count: int, timeout_s: float) -> dict:
    """Wait until the master's status page lists ``count`` alive workers; return the page."""
    return wait_for_status(cluster, lambda page: page.get("aliveworkers", 0) >= count,
                           f"{count} workers did not register", timeout_s)


def wait_for_status(cluster: "Standalone", ready, what: str, timeout_s: float) -> dict:
    """Poll the master's status page (its web UI's JSON) until ``ready(page)``; return the page."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    deadline, seen = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            with opener.open(cluster.status_url, timeout=2) as page:
                seen = json.load(page)
            if ready(seen):
                return seen
        except OSError:
            pass
        if any(proc.poll() is not None for proc in cluster.procs):
            break
        time.sleep(0.3)
    logs = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}" for log in cluster.root.glob("*.log"))
    raise RuntimeError(f"{what} on {cluster.url} within {timeout_s:.0f} s "
                       f"(status: {seen}):\n{logs}")


@dataclass
class Standalone:
    """A running standalone cluster: its master URL, folder, and the processes to stop."""

    url: str
    root: Path
    procs: list = field(default_factory=list)
    status_url: str = ""  # the master's status page (its web UI's JSON)

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(Path(spark_home()) / "bin" / "spark-class"), *args], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def wait_for_workers(self, count: int, timeout_s: float) -> dict:
        return wait_for_workers(self, count, timeout_s)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            kill_group(proc)


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    home.mkdir(parents=True, exist_ok=True)
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_DIRS=str(home / "local"),
               TMPDIR=str(home / "tmp"))
    for key in ("SPARK_LOCAL_DIRS", "TMPDIR"):
        Path(env[key]).mkdir(exist_ok=True)
    return env


def worker_env(home: Path) -> dict[str, str]:
    """A worker's environment: no PYTHONPATH of the test run's (a worker's executors find their packages
    through their own Python, as on a real cluster, so a bare Python stays bare)."""
    env = base_env(home)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="session")
def standalone(tmp_path_factory):
    """A master and two one-core workers on 127.0.0.1, as separate processes; the master is waited for,
    the workers are not (an application waits for its executors). Stopped at the end of the run."""
    root = tmp_path_factory.mktemp("standalone")
    port = free_port()
    cluster = Standalone(f"spark://127.0.0.1:{port}", root)
    ui = free_port()
    try:
        cluster.start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                                 "--webui-port", str(ui)], base_env(root / "master"))
        for i in (1, 2):  # started at once: a worker retries until the master answers
            home = root / f"worker{i}"
            cluster.start(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", cluster.url, "--host", "127.0.0.1",
                                         "--cores", "1", "--memory", "2g", "--work-dir", str(home / "work"),
                                         "--webui-port", str(free_port())], worker_env(home))
        cluster.status_url = f"http://127.0.0.1:{ui}/json/"
        wait_for_port(cluster, port, timeout_s=60)  # what irbis.get_spark checks before it starts a driver
        yield cluster
    finally:
        cluster.stop()


class App:
    """The driver process of an application on the cluster, running ``cluster_checks.py``; its
    :meth:`result` waits for it."""

    def __init__(self, cluster: Standalone, name: str, checks: list[str], images: str = "",
                 bare_python: str = "", environment: str = "") -> None:
        self.cluster, self.home = cluster, cluster.root / name
        self.out = self.home / "out"
        self.out.mkdir(parents=True)
        env = base_env(self.home)
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        self.log = self.home / "driver.log"
        self.t0 = time.perf_counter()
        with open(self.log, "wb") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHECKS), "--master", cluster.url, "--out", str(self.out), "--images", images,
                 "--bare-python", bare_python, "--environment", environment, *checks],
                env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        cluster.procs.append(self.proc)
        self._result: dict | None = None
        self.companions: list[App] = []  # other applications whose results come with this one's

    def result(self, timeout_s: float = 300.0) -> dict:
        """What the driver wrote (``results.json``), plus ``out`` (the folder of the arrays it saved) and
        ``seconds`` (its run time); the driver is stopped after ``timeout_s``."""
        if self._result is None:
            try:
                self.proc.wait(max(timeout_s - (time.perf_counter() - self.t0), 1))
            except subprocess.TimeoutExpired:
                pass
            finally:
                kill_group(self.proc, grace_s=2.0)
            seconds = time.perf_counter() - self.t0
            found = self.out / "results.json"
            results = json.loads(found.read_text()) if found.exists() else {}
            if not results.get("done"):
                logs = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}"
                                  for log in sorted(self.cluster.root.glob("*.log")))
                raise RuntimeError(f"the cluster driver stopped after {seconds:.0f} s (exit code "
                                   f"{self.proc.returncode}) with results {results}:\n"
                                   f"{self.log.read_text(errors='replace')[-4000:]}\n{logs}")
            self._result = results | {"out": self.out, "seconds": seconds}
            for other in self.companions:
                self._result |= {k: v for k, v in other.result(timeout_s).items() if k not in self._result}
        return self._result


@pytest.fixture(scope="session")
def cluster_images(tmp_path_factory):
    """Six small generated images (PNG and JPEG, two sizes) in one folder."""
    import cv2
    import numpy as np

    folder = tmp_path_factory.mktemp("cluster_images")
    rng = np.random.default_rng(0)
    for i in range(6):
        h, w = (48, 64) if i % 2 else (80, 60)
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.dstack([(xx * (i + 3)) % 256, (yy * (7 - i)) % 256, rng.integers(0, 256, (h, w))]).astype(np.uint8)
        cv2.imwrite(str(folder / f"img{i}.{'png' if i % 2 else 'jpg'}"), img)
    return folder


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory):
    """The Python of a fresh virtual environment with nothing installed (no irbis)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


@pytest.fixture(scope="session")
def packed_env(tmp_path_factory):
    """``irbis pack``'s PEX of this environment (Irbis and its packages, without pyspark and py4j)."""
    from irbis.spark.environment import pack

    packed = pack(tmp_path_factory.mktemp("packed") / "irbis-env.pex")
    print(f"irbis pack: {packed.bytes / 2**20:.0f} MiB in {packed.seconds:.0f} s")
    return str(packed.path)


@pytest.fixture(scope="session")
def cluster_app(standalone, cluster_images, bare_python, packed_env):
    """The cluster's drivers, started at once and left running while the tests compute the local
    results. First an application of one executor whose Python is ``bare_python`` fits (and fails), then
    one whose executor's Python also lacks irbis fits with ``packed_env`` shipped (and succeeds);
    once it is registered the main application's driver starts, and waits for both cores: it runs the featurizer
    and the two fits. Its :meth:`App.result` holds the main application's results and ``fit_bare``."""
    bare = App(standalone, "bare", ["fit_bare", "fit_packed"], bare_python=bare_python, environment=packed_env)
    wait_for_apps(standalone, 1, timeout_s=90)  # registered first, so that it gets its core first
    main = App(standalone, "checks", ["featurize", "sync", "dcasgd"], images=str(cluster_images))
    main.companions.append(bare)
    return main
