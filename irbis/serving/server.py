"""Running the server: :func:`serve` (blocking, as ``irbis serve`` does) and :class:`BackgroundServer`.

Uvicorn runs the app; on SIGTERM or Ctrl-C it stops accepting connections, lets the requests it has
accepted finish (the batcher drains its queue before it stops), then exits. Its HTTP protocol closes a
refused connection by lingering (:mod:`irbis.serving.linger`), so that a client still sending a body
over the limit reads its 413.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import asdict
from typing import Any, Sequence

from irbis.serving.app import ServeOptions, make_app
from irbis.serving.predictor import load_predictor

__all__ = ["BackgroundServer", "build_app", "serve", "uvicorn_settings"]

#: Environment variable holding the bearer token that guards ``/predict``.
TOKEN_ENV = "IRBIS_SERVE_TOKEN"
_CONFIG_ENV = "IRBIS_SERVE_CONFIG"
#: Seconds the server waits for accepted requests on shutdown.
GRACE_S = 30
#: How uvicorn runs every server: warnings only, no access log (a log record per request costs more
#: than a small pipeline), and a grace period for the accepted requests on shutdown.
UVICORN = {"log_level": "warning", "access_log": False, "timeout_graceful_shutdown": GRACE_S}


def uvicorn_settings(options: ServeOptions | None = None) -> dict[str, Any]:
    """:data:`UVICORN`, and the HTTP protocol with lingering close for ``options``' body limit."""
    from irbis.serving.linger import http_protocol

    return {**UVICORN, "http": http_protocol((options or ServeOptions()).max_body_bytes)}


def _pipeline_path(pipeline: Any) -> str:
    if isinstance(pipeline, (str, os.PathLike)):
        return os.fspath(pipeline)
    folder = tempfile.mkdtemp(prefix="irbis-serve-")
    pipeline.write().overwrite().save(folder)  # a fitted stage object: served from its saved form
    return folder


def build_app(pipeline: Any, outputs: Sequence[str] | None = None, spark: str | None = None,
              options: ServeOptions | None = None) -> Any:
    """Load ``pipeline`` (a saved folder, or a fitted stage) and return its ASGI app."""
    from irbis.kernels.engines.ort import set_thread_spinning
    from irbis.kernels.threads import default_threads, set_threads

    set_thread_spinning(False)  # requests arrive with gaps: idle engine threads must not hold the cores
    options = options or ServeOptions()
    set_threads(options.threads or default_threads())  # the server is the kernels' runner: it sets their threads
    if options.token is None and os.environ.get(TOKEN_ENV):
        options.token = os.environ[TOKEN_ENV]
    return make_app(load_predictor(_pipeline_path(pipeline), outputs, spark), options)


def app_from_env() -> Any:
    """The app of a uvicorn worker process (``--workers N``), configured through the environment."""
    config = json.loads(os.environ[_CONFIG_ENV])
    return build_app(config["pipeline"], config["outputs"], config["spark"], ServeOptions(**config["options"]))


def serve(pipeline: Any, host: str = "127.0.0.1", port: int = 8080, workers: int = 1,
          outputs: Sequence[str] | None = None, token: str | None = None, spark: str | None = None,
          options: ServeOptions | None = None) -> None:
    """Serve a fitted pipeline over HTTP until SIGTERM or Ctrl-C.

    Parameters
    ----------
    pipeline : str or fitted stage
        Folder of a saved ``PipelineModel`` (or one saved stage), or a fitted stage.
    host, port : str, int
        Where to listen; loopback unless ``host`` says otherwise.
    workers : int
        Server processes, each loading the pipeline (default 1: one process batches best, and its
        network uses every core). With more, each network gets ``cores // workers`` threads unless
        ``OMP_NUM_THREADS`` says otherwise; more than one helps a cheap tabular pipeline under load.
    outputs : list of str, optional
        Output columns to return (default: the last stage's output columns, e.g. a classifier's
        ``rawPrediction``, ``probability`` and ``prediction``); ``["all"]``: every column the pipeline writes.
    token : str, optional
        Bearer token guarding ``/predict`` (default: the ``IRBIS_SERVE_TOKEN`` variable).
    spark : str, optional
        A Spark master: serve stages without a kernel through an embedded Spark session (slower).

    Examples
    --------
    >>> serve("model/", port=8080)  # doctest: +SKIP
    """
    import uvicorn

    options = options or ServeOptions()
    options.token = token or options.token or os.environ.get(TOKEN_ENV)
    path = _pipeline_path(pipeline)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if workers == 1:
        app = build_app(path, outputs, spark, options)
        uvicorn.run(app, host=host, port=port, **uvicorn_settings(options))
        return
    load_predictor(path, outputs, spark)  # refuse a pipeline without kernels before forking
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    os.environ[_CONFIG_ENV] = json.dumps({"pipeline": path, "outputs": list(outputs or []), "spark": spark,
                                          "options": asdict(options)})
    uvicorn.run("irbis.serving.server:app_from_env", factory=True, host=host, port=port, workers=workers,
                **uvicorn_settings(options))


class BackgroundServer:
    """A server on a thread of this process (tests, notebooks): ``with BackgroundServer(app) as url``.

    A refused connection lingers by the body limit of the options :func:`~irbis.serving.app.make_app` gave
    ``app``; ``http`` replaces the HTTP protocol (uvicorn's ``http`` setting).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, http: Any = None) -> None:
        import uvicorn

        settings = uvicorn_settings(getattr(getattr(app, "state", None), "options", None))
        if http is not None:
            settings["http"] = http
        self.config = uvicorn.Config(app, host=host, port=port, **settings)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> str:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            threading.Event().wait(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
