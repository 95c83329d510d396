"""The HTTP adapter: a Starlette app around a predictor and its batcher (the only web-framework import).

Routes: ``POST /predict``, ``GET /health`` (the process is up), ``GET /ready`` (the pipeline is
loaded and the server is not stopping), ``GET /metrics`` (Prometheus text) and
``GET /openapi.json`` (generated from the pipeline's input columns).

A pipeline that reads images has its requests parsed (decoded) on a small pool of threads: OpenCV
releases the GIL, so the images of the next batch decode in parallel while the current batch runs,
and the event loop is never held by a decode. A request that finds the server idle skips the pool and
the queue: the batcher's worker thread decodes it, runs the pipeline and encodes the answer in one go
(:meth:`irbis.serving.batcher.Batcher.run_alone`), two thread hops fewer.
"""
from __future__ import annotations

import asyncio
import gc
import hmac
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, AsyncGenerator, AsyncIterator, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from irbis.serving.batcher import Batcher, Overloaded
from irbis.serving.codecs import IMAGE_TYPES, Parsed, RequestError, encode_response, parse_files, parse_json
from irbis.serving.openapi import openapi_document

__all__ = ["ServeOptions", "make_app"]


@dataclass
class ServeOptions:
    """Limits and switches of a server (the CLI's flags)."""

    max_batch_size: int = 64
    max_wait_ms: float = 2.0
    max_queue: int = 1024
    max_body_bytes: int = 16 * 1024 * 1024
    timeout_s: float = 30.0
    token: str | None = None
    #: Threads of the pipeline's kernels (torch, OpenCV, the engines); None: ``OMP_NUM_THREADS``, else every core.
    threads: int | None = None
    #: Split a drain of text requests into length groups, shortest first (:class:`irbis.serving.batcher.Batcher`).
    length_groups: bool = False

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_queue", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_wait_ms < 0 or self.timeout_s <= 0:
            raise ValueError(f"max_wait_ms must be at least 0 and timeout_s above 0, got "
                             f"{self.max_wait_ms} and {self.timeout_s}")


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("irbis_requests", "predict requests by HTTP status", ["status"],
                                registry=self.registry)
        self.latency = Histogram("irbis_request_seconds", "predict latency", registry=self.registry,
                                 buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.batch = Histogram("irbis_batch_rows", "rows per pipeline call", registry=self.registry,
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.depth = Gauge("irbis_queue_depth", "requests waiting for the pipeline", registry=self.registry)
        self._by_status: dict[int, Any] = {}

    def on_batch(self, rows: int, depth: int) -> None:
        """A pipeline call of ``rows`` rows started, ``depth`` requests left waiting."""
        self.batch.observe(rows)
        self.depth.set(depth)

    def answered(self, status: int, seconds: float) -> None:
        """Count one answer and its latency (the labelled counter is looked up once per status)."""
        counter = self._by_status.get(status)
        if counter is None:
            counter = self._by_status[status] = self.requests.labels(str(status))
        counter.inc()
        self.latency.observe(seconds)


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status, headers=headers or None)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"body of {declared} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _once(body: bytes) -> AsyncGenerator[bytes, None]:
    yield body


async def _parse_job(request: Request, body: bytes, predictor: Any) -> Callable[[], Parsed]:
    """The request's decoding, ready to run anywhere (a multipart body is split into parts here)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        return partial(parse_json, body, predictor.inputs, predictor.nullable)
    if kind.startswith(IMAGE_TYPES):
        return partial(parse_files, [(None, body)] if body else [], predictor.inputs)
    if kind == "multipart/form-data":
        try:
            form = await MultiPartParser(request.headers, _once(body)).parse()
        except MultiPartException as err:
            raise RequestError(400, f"malformed multipart body: {err}") from None
        files = [(name, await v.read()) for name, v in form.multi_items() if not isinstance(v, str)]
        return partial(parse_files, files, predictor.inputs)
    accepted = "application/json" + (", image/*, multipart/form-data" if any(
        "image" in k for k in predictor.inputs.values()) else "")
    raise RequestError(415, f"content type {kind or 'missing'!r} is not accepted; send {accepted}")


async def _off_loop(pool: ThreadPoolExecutor | None, fn: Callable[[], Any]) -> Any:
    """``fn()`` on ``pool`` (image decoding), or right here when there is none (JSON of numbers)."""
    if pool is None:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(pool, fn)


def _answer_alone(parse: Callable[[], Parsed], predict: Callable[[Any], Any]) -> tuple[bytes, int]:
    """A lone request from body to answer on one thread: decode, run the pipeline, encode."""
    parsed = parse()
    return encode_response(predict(parsed.columns), parsed.single), parsed.rows


def _decoders(predictor: Any) -> ThreadPoolExecutor | None:
    """A pool decoding the images of requests (one thread per core, at most 4), if the pipeline reads any."""
    if not any("image" in kinds for kinds in predictor.inputs.values()):
        return None
    return ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="irbis-decode")


def _authorised(request: Request, token: str | None) -> bool:
    if not token:
        return True
    given = request.headers.get("authorization", "")
    return given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), token.encode())


def make_app(predictor: Any, options: ServeOptions | None = None) -> Starlette:
    """The ASGI app serving ``predictor`` (a :class:`irbis.serving.predictor.Predictor`)."""
    options = options or ServeOptions()
    metrics = _Metrics()
    batcher = Batcher(predictor.predict, options.max_batch_size, options.max_wait_ms, options.max_queue,
                      on_batch=metrics.on_batch,
                      groups=getattr(predictor, "length_groups", None) if options.length_groups else None)
    document = openapi_document(predictor)
    decoders = _decoders(predictor)

    async def predict(request: Request) -> Response:
        start = time.perf_counter()
        response = await _predict(request)
        metrics.answered(response.status_code, time.perf_counter() - start)
        return response

    async def _predict(request: Request) -> Response:
        if not _authorised(request, options.token):
            return _error(401, "missing or wrong bearer token", **{"WWW-Authenticate": "Bearer"})
        try:
            body = await _read_body(request, options.max_body_bytes)
            parse = await _parse_job(request, body, predictor)
            if decoders is not None and batcher.idle:  # alone: decode and predict in one thread hop
                answer, rows = await batcher.run_alone(partial(_answer_alone, parse, predictor.predict),
                                                       options.timeout_s)
                metrics.batch.observe(rows)
                return Response(answer, media_type="application/json")
            parsed = await _off_loop(decoders, parse)
            out = await batcher.submit(parsed.columns, parsed.rows, options.timeout_s)
        except RequestError as err:
            return _error(err.status, str(err))
        except Overloaded as err:
            return _error(503, f"server busy: {err}; retry shortly", **{"Retry-After": "1"})
        except asyncio.TimeoutError:
            return _error(504, f"the pipeline did not answer within {options.timeout_s:g} s")
        except (ValueError, TypeError) as err:
            return _error(422, f"the pipeline refused the input: {err}")
        except Exception as err:  # noqa: BLE001 (this request alone fails)
            return _error(500, f"the pipeline failed: {type(err).__name__}: {err}")
        return Response(encode_response(out, parsed.single), media_type="application/json")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        if batcher.stopping:
            return _error(503, "stopping")
        return JSONResponse({"status": "ready", "inputs": sorted(predictor.inputs),
                             "outputs": predictor.outputs, "spark": bool(predictor.slow)})

    async def metrics_route(request: Request) -> Response:
        metrics.depth.set(batcher.depth)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await batcher.start()
        gc.freeze()  # the loaded pipeline's objects leave the collector's scans for good
        yield
        await batcher.stop()
        if decoders is not None:
            decoders.shutdown(wait=True)

    routes = [Route("/predict", predict, methods=["POST"]), Route("/health", health),
              Route("/ready", ready), Route("/metrics", metrics_route), Route("/openapi.json", openapi)]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.batcher = batcher
    app.state.options = options  # the server reads the body limit (how long a refused connection lingers)
    return app
