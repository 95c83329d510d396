"""A Spark standalone cluster on this host: a master and workers as separate processes, started with
PySpark's own launcher (``bin/spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker``).

Unlike ``local-cluster``, whose executors share the driver's environment, each worker here runs with its
own environment, work directory, ``SPARK_LOCAL_DIRS`` and ``TMPDIR``, as the hosts of a real cluster do:
it is how Irbis tries its cluster path (the ``cluster`` tests, ``benchmarks/cluster.py``) and how a user
can try a job in client mode before taking it to theirs.

Examples
--------
>>> from irbis.spark.standalone import start_standalone   # doctest: +SKIP
>>> with start_standalone("/scratch/cluster", workers=2, cores=1) as cluster:   # doctest: +SKIP
...     spark = irbis.get_spark(cluster.url)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from irbis.spark.hosts import SimulatedHosts


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different TCP ports free on ``host`` now (held open together while chosen, so that no two
    are the same)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def spark_home() -> str:
    """The Spark installation PySpark runs (its ``bin/spark-class``)."""
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()


def kill_group(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
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


def process_env(home: Path, host: str = "127.0.0.1", keep_pythonpath: bool = True) -> dict[str, str]:
    """The environment of one of the cluster's processes: this one's, less its ``PYSPARK_*`` and ``SPARK_*``
    settings, with ``SPARK_LOCAL_DIRS`` and ``TMPDIR`` of its own under ``home``. A worker gets no
    ``PYTHONPATH`` (``keep_pythonpath=False``): its executors find their packages through their own Python,
    as on a real cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    if not keep_pythonpath:
        env.pop("PYTHONPATH", None)
    home.mkdir(parents=True, exist_ok=True)
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP=host, SPARK_LOCAL_DIRS=str(home / "local"),
               TMPDIR=str(home / "tmp"))
    for key in ("SPARK_LOCAL_DIRS", "TMPDIR"):
        Path(env[key]).mkdir(exist_ok=True)
    return env


@dataclass
class Standalone:
    """A running standalone cluster: its master URL, its folder, the processes to stop, and its master's
    status page (the web UI's JSON). A context manager: leaving the block stops every process."""

    url: str
    root: Path
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)
    status_url: str = ""

    def start(self, name: str, args: list[str], env: Mapping[str, str],
              prefix: Sequence[str] = ()) -> subprocess.Popen[Any]:
        """Start ``spark-class args`` in a process group of its own, logging to ``root/name.log``; ``prefix``
        runs it elsewhere (a simulated host's ``ip netns exec``, :mod:`irbis.spark.hosts`)."""
        with open(self.root / f"{name}.log", "wb") as out:
            proc = subprocess.Popen([*prefix, str(Path(spark_home()) / "bin" / "spark-class"), *args], env=dict(env),
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def status(self, ready: Callable[[dict[str, Any]], bool], what: str, timeout_s: float) -> dict[str, Any]:
        """Poll the master's status page until ``ready(page)``; return the page, or raise naming ``what``
        with the end of every log of the cluster."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        deadline, seen = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            try:
                with opener.open(self.status_url, timeout=2) as page:
                    seen = json.load(page)
                if ready(seen):
                    return seen
            except OSError:
                pass
            if any(proc.poll() is not None for proc in self.procs):
                break
            time.sleep(0.3)
        raise RuntimeError(f"{what} on {self.url} within {timeout_s:.0f} s (status: {seen}):\n{self.logs()}")

    def wait_for_workers(self, count: int, timeout_s: float = 60.0) -> dict[str, Any]:
        """Wait until ``count`` workers are alive; return the status page."""
        return self.status(lambda page: page.get("aliveworkers", 0) >= count, f"{count} workers did not register",
                           timeout_s)

    def wait_for_apps(self, count: int, timeout_s: float = 60.0) -> dict[str, Any]:
        """Wait until ``count`` applications are running; return the status page."""
        return self.status(lambda page: len(page.get("activeapps", [])) >= count,
                           f"{count} applications did not start", timeout_s)

    def wait_for_master(self, timeout_s: float = 60.0) -> None:
        """Wait until the master accepts connections."""
        host, port = self.url.removeprefix("spark://").rsplit(":", 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                if self.procs[0].poll() is not None:
                    break
                time.sleep(0.2)
        raise RuntimeError(f"the master did not listen on {self.url} within {timeout_s:.0f} s:\n{self.logs()}")

    def logs(self, tail: int = 1500) -> str:
        """The end of each of the cluster's logs."""
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}"
                         for log in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        """Stop every process started here, the last first."""
        for proc in reversed(self.procs):
            kill_group(proc)

    def __enter__(self) -> Standalone:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_standalone(root: str | os.PathLike[str], workers: int = 2, cores: int = 1, memory: str = "2g",
                     host: str = "127.0.0.1", wait: bool = True, hosts: SimulatedHosts | None = None) -> Standalone:
    """Start a master and ``workers`` workers of ``cores`` cores and ``memory`` each on ``host``, each process
    with its own folder under ``root``; return once the master listens (and, with ``wait``, once every
    worker has registered). Stop it with :meth:`Standalone.stop` or a ``with`` block.

    With ``hosts`` (:class:`irbis.spark.hosts.SimulatedHosts`, open), the master runs on the driver's host
    (``hosts.driver_address``) and worker ``i`` on simulated host ``i % hosts.count``: their traffic, and
    their executors', crosses the hosts' links. A driver then binds to ``hosts.driver_address``."""
    if hosts is not None:
        host = hosts.driver_address
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    port, ui, *worker_uis = free_ports(2 + workers, host)
    cluster = Standalone(f"spark://{host}:{port}", root, status_url=f"http://{host}:{ui}/json/")
    try:
        cluster.start("master", ["org.apache.spark.deploy.master.Master", "--host", host, "--port", str(port),
                                 "--webui-port", str(ui)],
                      # no REST submission server: it listens on a fixed port (6066), which a second cluster on
                      # the host would find taken, and nothing here submits through it
                      {**process_env(root / "master", host), "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"})
        for i in range(1, workers + 1):  # started at once: a worker retries until the master answers
            home = root / f"worker{i}"
            where = hosts.address((i - 1) % hosts.count) if hosts is not None else host
            cluster.start(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", cluster.url, "--host", where,
                                         "--cores", str(cores), "--memory", memory, "--work-dir", str(home / "work"),
                                         "--webui-port", str(worker_uis[i - 1])],
                          process_env(home, where, keep_pythonpath=False),
                          hosts.argv((i - 1) % hosts.count, []) if hosts is not None else ())
        cluster.wait_for_master()
        if wait:
            cluster.wait_for_workers(workers)
    except BaseException:
        cluster.stop()
        raise
    return cluster


__all__ = ["Standalone", "free_port", "free_ports", "kill_group", "process_env", "spark_home", "start_standalone"]
