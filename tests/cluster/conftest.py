"""A Spark standalone cluster of separate processes for the ``cluster`` tests: one master and two
workers (one core, 2 GB each) started by :func:`irbis.spark.standalone.start_standalone` on loopback, each
worker with its own work, local and temporary directories.

A Python process holds one SparkContext, and the test run's process keeps its local session, so the
cluster's driver is a process of its own: :func:`run_checks` starts ``cluster_checks.py`` against the
master and reads back what it wrote. Every process started here runs in a process group of its own,
killed at the end of the run whatever the tests did.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from background import Background
from irbis.spark.standalone import Standalone, kill_group, process_env, start_standalone
from jvm_options import with_test_jvm_options

HERE = Path(__file__).resolve().parent
CHECKS = HERE / "cluster_checks.py"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """A master and two one-core workers on 127.0.0.1, as separate processes; the master is waited for,
    the workers are not (an application waits for its executors). Stopped after the module's tests."""
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
        env = with_test_jvm_options(process_env(self.home))
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
            for other in self.companions:  # a companion ships a PEX of about 1.7 GB to its executor: more time
                self._result |= {k: v for k, v in other.result(2 * timeout_s).items() if k not in self._result}
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


def pack_cache() -> Path:
    """Where the tests keep ``irbis pack``'s PEX between runs: outside the clone (a fresh clone of the same
    source on this machine reuses it), under ``$IRBIS_TEST_CACHE`` or the user's cache folder."""
    base = os.environ.get("IRBIS_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "irbis-tests")
    folder = Path(base) / "pack"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _build_pex(path: Path) -> str:
    """Pack this environment into ``path`` (uncompressed: about half the time of a compressed pack, read from a
    local disk), under a name of its own renamed once whole, so that an interrupted pack is never reused."""
    from irbis.spark.environment import pack

    if path.is_file():
        return f"irbis pack: reused {path.name}"
    # packs of environments that have changed since: the two newest stay (another clone may be shipping one)
    for old in sorted(path.parent.glob("irbis-env-*.pex"), key=lambda p: p.stat().st_mtime)[:-2]:
        old.unlink(missing_ok=True)
    for old in path.parent.glob("partial-*.pex"):  # left by an interrupted run, not by one packing now
        if time.time() - old.stat().st_mtime > 3600:
            old.unlink(missing_ok=True)
    packed = pack(path.with_name(f"partial-{os.getpid()}-{path.name}"), compress=False)
    packed.path.rename(path)
    return f"irbis pack: {packed.bytes / 2**20:.0f} MiB in {packed.seconds:.0f} s"


@functools.cache
def pex_path() -> Path:
    """Where this environment's PEX is kept (:func:`pack_cache`, named by :func:`environment_fingerprint`),
    fixed when the run first asks, before the pack: packing may itself change what the fingerprint reads."""
    return pack_cache() / f"irbis-env-{environment_fingerprint()}.pex"


def _packing() -> Background:
    """:func:`_build_pex` of this environment's PEX, in a thread of its own."""
    return Background("irbis pack", lambda: _build_pex(pex_path()))


#: The pack started when the run collected a test that ships it (:func:`pytest_collection_finish`).
_PACKING: list[Background] = []


def pytest_collection_finish(session):
    """Start packing as soon as the run is known to need the PEX, in a thread of its own: the ``cluster``
    tests run after the ordinary ones (``run_order`` in ``tests/conftest.py``), so the pack overlaps them
    instead of holding up the first cluster test."""
    needed = any("packed_env" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("skip")
                 for item in session.items)
    if needed and not session.config.option.collectonly and not session.config.getoption("--connect", False) \
            and not _PACKING:
        _PACKING.append(_packing())


@pytest.fixture(scope="session")
def packed_env():
    """``irbis pack``'s PEX of this environment (Irbis and its packages, without pyspark and py4j), kept in
    :func:`pack_cache` under :func:`environment_fingerprint`: a later run of an unchanged environment and
    source tree reuses it instead of packing again. Started at collection, waited for here."""
    if not _PACKING:
        _PACKING.append(_packing())
    print(_PACKING[0].result(timeout_s=900))
    return str(pex_path())


@pytest.fixture(scope="module")
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
