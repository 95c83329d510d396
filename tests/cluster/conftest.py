"""A Spark standalone cluster of separate processes for the ``cluster`` tests: one master and two
workers (one core, 2 GB each) started by :func:`irbis.spark.standalone.start_standalone` on loopback, each
worker with its own work, local and temporary directories.

A Python process holds one SparkContext, and the test run's process keeps its local session, so the
cluster's driver is a process of its own: :func:`run_checks` starts ``cluster_checks.py`` against the
master and reads back what it wrote. Every process started here runs in a process group of its own,
killed at the end of the run whatever the tests did.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from irbis.spark.standalone import Standalone, kill_group, process_env, start_standalone

HERE = Path(__file__).resolve().parent
CHECKS = HERE / "cluster_checks.py"


@pytest.fixture(scope="session")
def standalone(tmp_path_factory):
    """A master and two one-core workers on 127.0.0.1, as separate processes; the master is waited for,
    the workers are not (an application waits for its executors). Stopped at the end of the run."""
    cluster = start_standalone(tmp_path_factory.mktemp("standalone"), workers=2, cores=1, memory="2g", wait=False)
    with cluster:
        yield cluster


class App:
    """The driver process of an application on the cluster, running ``cluster_checks.py``; its
    :meth:`result` waits for it."""

    def __init__(self, cluster: Standalone, name: str, checks: list[str], images: str = "",
                 bare_python: str = "", environment: str = "") -> None:
        self.cluster, self.home = cluster, cluster.root / name
        self.out = self.home / "out"
        self.out.mkdir(parents=True)
        env = process_env(self.home)
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
                logs = self.cluster.logs()
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


def environment_fingerprint() -> str:
    """A digest of everything ``irbis pack`` puts in the PEX: this Python's version, every installed
    distribution's name and version, and the bytes of Irbis's source tree (the wheel built from it)."""
    import hashlib
    import importlib.metadata

    import irbis

    digest = hashlib.sha256(sys.version.encode())
    for name, version in sorted((d.metadata["Name"] or "", d.version) for d in importlib.metadata.distributions()):
        digest.update(f"{name}=={version}\n".encode())
    source = Path(irbis.__file__).resolve().parent
    for path in sorted([*source.rglob("*"), source.parent / "pyproject.toml"]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(source.parent).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def packed_env(request, tmp_path_factory):
    """``irbis pack``'s PEX of this environment (Irbis and its packages, without pyspark and py4j), kept in
    pytest's cache under :func:`environment_fingerprint`: a later run of an unchanged environment and
    source tree reuses it instead of packing again. Packed uncompressed: about 1 minute, against 2 compressed."""
    from irbis.spark.environment import pack

    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("irbis-pack") if cache is not None else tmp_path_factory.mktemp("packed")
    path = Path(folder) / f"irbis-env-{environment_fingerprint()}.pex"
    if path.is_file():
        print(f"irbis pack: reused {path.name}")
        return str(path)
    for old in Path(folder).glob("irbis-env-*.pex"):  # packs of an environment that has changed since
        old.unlink()
    # written under a name of its own, renamed once whole: an interrupted pack is never reused
    packed = pack(path.with_name(f"partial-{path.name}"), compress=False)  # built faster; read from a local disk
    packed.path.rename(path)
    print(f"irbis pack: {packed.bytes / 2**20:.0f} MiB in {packed.seconds:.0f} s")
    return str(path)


@pytest.fixture(scope="session")
def cluster_app(standalone, cluster_images, bare_python, packed_env):
    """The cluster's drivers, started at once and left running while the tests compute the local
    results. First an application of one executor whose Python is ``bare_python`` fits (and fails), then
    one whose executor's Python also lacks irbis fits with ``packed_env`` shipped (and succeeds);
    once it is registered the main application's driver starts, and waits for both cores: it runs the
    featurizer, the two fits, the sync model served by two replicas on the executors, and ImageLIME. Its
    :meth:`App.result` holds the main application's results and ``fit_bare``."""
    bare = App(standalone, "bare", ["fit_bare", "fit_packed"], bare_python=bare_python, environment=packed_env)
    standalone.wait_for_apps(1, timeout_s=90)  # registered first, so that it gets its core first
    main = App(standalone, "checks", ["featurize", "sync", "dcasgd", "serve", "lime"], images=str(cluster_images))
    main.companions.append(bare)
    return main
