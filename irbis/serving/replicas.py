"""Scale-out: one server per Spark executor, kept up by a long-running barrier stage.

``irbis serve PIPELINE_DIR --master MASTER --replicas N`` runs a barrier stage of N tasks
(``mapInArrow(..., barrier=True)``, public DataFrame API); each task loads the pipeline from the
shared folder, binds a socket on its executor and reports ``host:port`` to the driver over a small
TCP listener, then serves until the stage is cancelled. The driver prints the addresses and writes
them, one per line, to a file for a load balancer. A replica that dies fails its task; Spark re-runs
the barrier stage (on cluster masters) and the new replicas report their addresses again.
"""
from __future__ import annotations

import socket
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Sequence

from irbis.serving.app import ServeOptions
from irbis.spark.guard import on_executors

__all__ = ["Replicas", "serve_on_spark", "start_replicas"]

#: Addresses that only their own host reaches.
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _replica_task(path: str, shipped: str | None, outputs: list[str], options: dict[str, Any], host: str,
                  port: int, driver: tuple[str, int]) -> Any:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import uvicorn
        from pyspark import BarrierTaskContext

        from irbis.serving.server import build_app, uvicorn_settings
        from irbis.spark.files import localize

        ctx = BarrierTaskContext.get()
        where = localize(path, shipped)  # the executor's copy where it lacks the driver's folder
        served = ServeOptions(**options)
        app = build_app(where, outputs or None, None, served)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # clients queue from now on instead of being refused while uvicorn starts
        public = host if host not in ("0.0.0.0", "") else ctx.getTaskInfos()[ctx.partitionId()].address.split(":")[0]
        address = f"{public}:{sock.getsockname()[1]}"
        report = socket.create_connection(driver, timeout=30)
        report.sendall(f"{ctx.partitionId()} {address}\n".encode())
        server = uvicorn.Server(uvicorn.Config(app, **uvicorn_settings(served)))
        threading.Thread(target=_stop_when_driver_leaves, args=(report, server), daemon=True).start()
        server.run(sockets=[sock])
        yield from ()

    return run


def _stop_when_driver_leaves(report: socket.socket, server: Any) -> None:
    """Stop the replica once the driver closes its connection (``stop()``, or the driver is gone)."""
    report.settimeout(None)
    try:
        while report.recv(1024):
            pass
    except OSError:
        pass
    server.should_exit = True


class Replicas:
    """Running replicas: :attr:`addresses` (``host:port``, by partition) and :meth:`stop`."""

    def __init__(self, spark: Any, count: int, addresses_file: str | None, listen: str = "127.0.0.1") -> None:
        self.spark, self.count, self.file = spark, count, addresses_file
        self.addresses: dict[int, str] = {}
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._listener = socket.create_server((listen, 0))  # the driver's address, as its executors reach it
        self._connections: list[socket.socket] = []  # one per replica, open while it should serve
        self.job: threading.Thread | None = None

    @property
    def driver_port(self) -> int:
        return self._listener.getsockname()[1]

    def _collect(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            line = conn.makefile().readline().split()
            self._connections.append(conn)
            if len(line) == 2:
                self.addresses[int(line[0])] = line[1]
                if len(self.addresses) == self.count:
                    self._publish()

    def _publish(self) -> None:
        lines = [self.addresses[i] for i in sorted(self.addresses)]
        if self.file:
            Path(self.file).write_text("\n".join(lines) + "\n")
        print("replicas serving at " + ", ".join(f"http://{a}" for a in lines)
              + (f" (written to {self.file})" if self.file else ""), flush=True)
        self.ready.set()

    def stop(self) -> None:
        """Close the replicas' connections (each replica then shuts down) and cancel the barrier stage."""
        self._listener.close()
        for conn in self._connections:
            conn.close()
        if self.job is not None:
            self.job.join(timeout=30)
        self.spark.interruptTag("irbis-serve")
        if self.job is not None:
            self.job.join(timeout=60)


def start_replicas(pipeline: str, spark: Any, replicas: int, host: str = "127.0.0.1", port: int = 0,
                   outputs: Sequence[str] | None = None, options: ServeOptions | None = None,
                   addresses_file: str | None = None) -> Replicas:
    """Start ``replicas`` servers on the executors of ``spark``; return once they all answer.

    Where the executors may not share the driver's disk the pipeline's folder is shipped to them
    (:func:`irbis.spark.files.ship_file`). On a cluster (a master that is not local) ``host`` must be an
    address others reach, such as ``0.0.0.0`` (each replica then reports its executor's address); loopback
    is refused there, naming it.
    """
    from irbis.serving.predictor import load_predictor
    from irbis.spark.files import ship_file
    from irbis.spark.resources import driver_host, is_local_master

    load_predictor(pipeline, outputs)  # refuse a pipeline without kernels before starting the stage
    if not is_local_master(spark) and host in LOOPBACK:
        raise ValueError(f"replicas on a cluster's executors bound to {host} answer nobody outside their own "
                         f"host: pass --host 0.0.0.0 (each replica reports its executor's address) or an "
                         f"address of the executors' network")
    path = str(Path(pipeline).resolve())
    shipped = ship_file(path)
    listen = driver_host(spark)
    handle = Replicas(spark, replicas, addresses_file, listen)
    threading.Thread(target=handle._collect, daemon=True).start()
    fn = _replica_task(path, shipped, list(outputs or []), asdict(options or ServeOptions()), host, port,
                       (listen, handle.driver_port))

    def run_job() -> None:
        spark.addTag("irbis-serve")
        try:
            spark.range(replicas, numPartitions=replicas).mapInArrow(on_executors(fn), "id long",
                                                                     barrier=True).collect()
        except Exception as err:  # noqa: BLE001 (cancelled on stop, or failed for good)
            handle.error = err
            handle.ready.set()
        finally:
            spark.removeTag("irbis-serve")

    handle.job = threading.Thread(target=run_job, daemon=True)
    handle.job.start()
    handle.ready.wait()
    if handle.error is not None and len(handle.addresses) < replicas:
        raise RuntimeError(f"the replicas did not start: {handle.error}")
    for address in handle.addresses.values():
        _wait_until_answering(address, handle)
    return handle


def _wait_until_answering(address: str, handle: Replicas, timeout: float = 300.0) -> None:
    """Block until ``GET /ready`` on ``address`` gets an HTTP answer other than 503."""
    import time
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to the executor
    deadline = time.monotonic() + timeout
    while True:
        try:
            with opener.open(f"http://{address}/ready", timeout=10):
                return
        except urllib.error.HTTPError as err:
            if err.code != 503:  # e.g. 401 behind an API key: the server answers
                return
        except OSError:
            pass
        if handle.error is not None or time.monotonic() > deadline:
            handle.stop()
            raise RuntimeError(f"the replica at {address} did not answer: {handle.error or 'timed out'}")
        time.sleep(0.2)


def serve_on_spark(pipeline: str, master: str, replicas: int, host: str = "127.0.0.1", port: int = 0,
                   outputs: Sequence[str] | None = None, options: ServeOptions | None = None,
                   addresses_file: str | None = None) -> None:
    """``irbis serve --master MASTER --replicas N``: start the replicas and keep them up until Ctrl-C."""
    from irbis.spark.session import get_spark

    if replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {replicas}")
    spark = get_spark(master, app_name="irbis-serve")
    handle = start_replicas(pipeline, spark, replicas, host, port, outputs, options, addresses_file)
    assert handle.job is not None  # start_replicas started it
    try:
        handle.job.join()
    except KeyboardInterrupt:
        handle.stop()
