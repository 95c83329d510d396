"""The HTTP server over real loopback HTTP, on small pure-Python pipelines (no JVM).

A :class:`Predictor` is built from kernels directly, so the robustness paths (flood, timeout, one
failing request, shutdown) can use kernels that are slow or fail on purpose.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from irbis.kernels.chain import KernelChain, StageKernel
from irbis.kernels.sparkml.stage_kernels import assemble_vectors
from irbis.serving.app import ServeOptions, make_app
from irbis.serving.predictor import Predictor
from irbis.serving.server import BackgroundServer


def _sum_kernel(fail_on: float | None = None, started: list | None = None,
                gate: threading.Event | None = None) -> StageKernel:
    """``a`` plus the values of ``v``; ``started`` records each call's values of ``a``, ``gate`` holds every call
    until the test opens it."""
    def run(blocks):
        if started is not None:
            started.append(list(blocks["a"]))
        if gate is not None and not gate.wait(60):
            raise RuntimeError("the test never opened the gate")
        a = np.asarray(blocks["a"], np.float64)
        if fail_on is not None and (a == fail_on).any():
            raise RuntimeError(f"refusing {fail_on}")
        vec = assemble_vectors([blocks["a"], blocks["v"]], len(a))
        return {"total": vec.values.sum(axis=1), "vec": vec}
    return StageKernel(["a", "v"], ["total", "vec"], run, nulls=False,
                       kinds={"a": frozenset({"number"}), "v": frozenset({"vector"})})


def _until(condition, what: str, timeout: float = 60.0) -> None:
    """Wait until ``condition()`` holds; fail saying ``what`` did not happen if it has not after ``timeout`` s
    (a bound for a broken server, never a timing the test depends on)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.005)


def _post(url: str, a: float):
    return httpx.post(f"{url}/predict", json={"a": a, "v": [0]}, timeout=60)


def _predictor(**kw) -> Predictor:
    return Predictor(KernelChain([_sum_kernel(**kw)]))


@pytest.fixture(scope="module")
def url():
    with BackgroundServer(make_app(_predictor(), ServeOptions(max_body_bytes=4096))) as url:
        yield url


def test_rows_in_request_shape(url):
    one = httpx.post(f"{url}/predict", json={"a": 1, "v": [2.0, 3.0]})
    assert one.status_code == 200 and one.json() == {"total": 6.0, "vec": [1.0, 2.0, 3.0]}
    many = httpx.post(f"{url}/predict", json=[{"a": 1, "v": [2, 3]}, {"a": -1, "v": [0.5, 0.5]}])
    assert many.json() == [{"total": 6.0, "vec": [1.0, 2.0, 3.0]}, {"total": 0.0, "vec": [-1.0, 0.5, 0.5]}]


@pytest.mark.parametrize("body, content_type, status, words", [
    (b"{", "application/json", 400, "malformed JSON"),
    (b"", "application/json", 400, "empty body"),
    (b'{"a": 1}', "application/json", 422, "missing columns ['v']"),
    (b'{"a": 1, "v": [1], "w": 2}', "application/json", 422, "unknown columns ['w']"),
    (b'{"a": "x", "v": [1]}', "application/json", 422, "column 'a' must be a number"),
    (b'{"a": 1, "v": ["x"]}', "application/json", 422, "column 'v' must be a non-empty list"),
    (b'{"a": NaN, "v": [1]}', "application/json", 422, "column 'a' is NaN"),
    (b'[{"a": 1, "v": [1]}, {"a": 1, "v": [1, 2]}]', "application/json", 422, "different shapes"),
    (b'{"a": 1, "v": [1]}', "text/plain", 415, "content type 'text/plain'"),
    (b"\x89PNG", "image/png", 415, "not one image column"),
    (b"x" * 5000, "application/json", 413, "over the limit"),
])
def test_bad_input_names_the_problem(url, body, content_type, status, words):
    response = httpx.post(f"{url}/predict", content=body, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert httpx.post(f"{url}/predict", json={"a": 1, "v": [1]}).status_code == 200  # still serving


def test_health_ready_metrics_openapi(url):
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/ready").json()
    assert ready["inputs"] == ["a", "v"] and ready["outputs"] == ["total", "vec"]
    httpx.post(f"{url}/predict", json={"a": 1, "v": [1]})
    text = httpx.get(f"{url}/metrics").text
    assert 'irbis_requests_total{status="200"}' in text
    assert "irbis_request_seconds_bucket" in text and "irbis_batch_rows_count" in text
    assert "irbis_queue_depth" in text
    doc = httpx.get(f"{url}/openapi.json").json()
    row = doc["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]["oneOf"][0]
    assert row["required"] == ["a", "v"] and row["properties"]["a"] == {"type": "number"}
    assert row["properties"]["v"]["type"] == "array"


def test_token_guards_predict():
    app = make_app(_predictor(), ServeOptions(token="s3cret"))
    with BackgroundServer(app) as url:
        row = {"a": 1, "v": [1]}
        assert httpx.post(f"{url}/predict", json=row).status_code == 401
        wrong = httpx.post(f"{url}/predict", json=row, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        ok = httpx.post(f"{url}/predict", json=row, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["total"] == 2.0
        assert httpx.get(f"{url}/health").status_code == 200  # only /predict is guarded


def test_flood_gets_503_with_retry_after_and_recovers():
    """The pipeline's calls hold until the first answer comes back: the call running and the two requests the
    queue holds cannot finish before then, so of the sixteen requests some are certainly refused, and the first
    answer is a refusal, however slowly the clients send them; the held ones are served once the gate opens."""
    gate = threading.Event()
    app = make_app(_predictor(gate=gate), ServeOptions(max_batch_size=1, max_queue=2))
    with BackgroundServer(app) as url, ThreadPoolExecutor(16) as pool:
        try:
            futures = [pool.submit(_post, url, i) for i in range(16)]
            first = next(as_completed(futures, timeout=60)).result()
        finally:
            gate.set()
        answers = [f.result() for f in futures]
        assert first.status_code == 503
        refused = [r for r in answers if r.status_code == 503]
        served = [r for r in answers if r.status_code == 200]
        assert refused and served and len(refused) + len(served) == 16
        assert all(r.headers["retry-after"] == "1" and "busy" in r.json()["error"] for r in refused)
        assert all(r.json()["total"] == json.loads(r.request.content)["a"] for r in served)
        assert httpx.post(f"{url}/predict", json={"a": 5, "v": [1]}, timeout=60).json()["total"] == 6.0


def test_timeout_gives_504():
    """The pipeline's call holds until the 504 has come back: the 0.1 s timeout cannot lose to the call."""
    gate = threading.Event()
    app = make_app(_predictor(gate=gate), ServeOptions(timeout_s=0.1))
    with BackgroundServer(app) as url:
        try:
            response = httpx.post(f"{url}/predict", json={"a": 1, "v": [1]}, timeout=60)
        finally:
            gate.set()
        assert response.status_code == 504 and "0.1 s" in response.json()["error"]


def test_one_failing_request_fails_alone():
    """A first request holds the pipeline until the test has queued the others behind it, 13 first: the batch
    that follows certainly holds 13 and other requests, fails, and is run again request by request."""
    gate = threading.Event()
    started: list[list[float]] = []
    app = make_app(_predictor(fail_on=13.0, started=started, gate=gate), ServeOptions(max_batch_size=64))
    batcher = app.state.batcher
    with BackgroundServer(app) as url, ThreadPoolExecutor(8) as pool:
        try:
            first = pool.submit(_post, url, 1)
            _until(lambda: started, "the first request's call")
            rest = [pool.submit(_post, url, 13)]
            _until(lambda: batcher.depth == 1, "13 queued behind the first request")
            rest += [pool.submit(_post, url, i) for i in (2, 4, 5, 6, 7, 8)]
            _until(lambda: batcher.depth == 7, "every request queued")
        finally:
            gate.set()
        answers = [first.result()] + [f.result() for f in rest]
    assert answers[1].status_code == 500 and "refusing 13" in answers[1].json()["error"]
    assert [r.status_code for r in answers[:1] + answers[2:]] == [200] * 7
    assert [r.json()["total"] for i, r in enumerate(answers) if i != 1] == [1, 2, 4, 5, 6, 7, 8]
    assert any(13 in call and len(call) > 1 for call in started)  # 13 did share a batch that failed
    assert [13] in started  # and ran again alone


def test_concurrent_requests_are_batched():
    """A first request holds the pipeline until sixteen more are queued behind it: they are certain to be
    waiting together when it is done, whatever the clients' pace."""
    gate = threading.Event()
    started: list[list[float]] = []
    app = make_app(_predictor(started=started, gate=gate), ServeOptions(max_batch_size=64))
    batcher = app.state.batcher
    with BackgroundServer(app) as url, ThreadPoolExecutor(17) as pool:
        try:
            first = pool.submit(_post, url, 0)
            _until(lambda: started, "the first request's call")
            rest = [pool.submit(_post, url, i) for i in range(1, 32)]
            _until(lambda: batcher.depth == 16, "sixteen requests queued")
        finally:
            gate.set()
        answers = [first.result()] + [f.result() for f in rest]
    assert [r.json()["total"] for r in answers] == [float(i) for i in range(32)]
    assert max(len(call) for call in started) > 1 and len(started) < 32


def test_shutdown_finishes_accepted_requests():
    """The pipeline's calls hold until the server has stopped listening (uvicorn's shutdown has begun) with all
    eight requests inside it: the stop certainly comes while requests are still waiting, and they are answered."""
    gate = threading.Event()
    started: list[list[float]] = []
    app = make_app(_predictor(started=started, gate=gate), ServeOptions(max_batch_size=2))
    server = BackgroundServer(app)
    url = server.start()
    batcher = app.state.batcher
    stopper = threading.Thread(target=server.stop)  # what uvicorn does on SIGTERM
    with ThreadPoolExecutor(8) as pool:
        try:
            futures = [pool.submit(_post, url, i) for i in range(8)]
            _until(lambda: sum(map(len, started)) + batcher.depth == 8, "every request in the server")
            assert sum(map(len, started)) < 8  # some are still waiting when the stop comes
            stopper.start()
            _until(lambda: not any(s.is_serving() for s in server.server.servers), "the server's shutdown")
        finally:
            gate.set()
        answers = [f.result() for f in futures]
        stopper.join()
    assert [r.status_code for r in answers] == [200] * 8
    assert [r.json()["total"] for r in answers] == [float(i) for i in range(8)]
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/predict", json={"a": 1, "v": [0]})


_json = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                         st.sampled_from(["a", "v", "w"]) | st.text(max_size=3), inner, max_size=4),
                     max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_json | st.binary(max_size=64).map(lambda b: ("raw", b)),
       content_type=st.sampled_from(["application/json", "text/plain", "image/png", "multipart/form-data", ""]))
def test_fuzz_never_5xx(url, body, content_type):
    data = body[1] if isinstance(body, tuple) else json.dumps(body).encode()
    response = httpx.post(f"{url}/predict", content=data, headers={"content-type": content_type})
    assert response.status_code < 500, (data, response.text)
    assert response.status_code == 200 or response.json()["error"]


def test_options_are_checked_when_made():
    with pytest.raises(ValueError, match="max_queue must be at least 1, got 0"):
        ServeOptions(max_queue=0)
    with pytest.raises(ValueError, match="timeout_s above 0"):
        ServeOptions(timeout_s=0)



def test_the_server_sets_its_kernels_threads_and_reads_saved_stages_without_spark():
    """build_app is the kernels' runner: it gives them its configured thread count; the stage it serves,
    saved in tests/data/saved_stages, is read through load_local with no JVM."""
    import sys
    from pathlib import Path

    import cv2

    from irbis.kernels import threads
    from irbis.serving.predictor import load_predictor
    from irbis.serving.server import build_app

    saved = Path(__file__).resolve().parents[2] / "data" / "saved_stages" / "image_transformer"
    torch = sys.modules.get("torch")
    before = (cv2.getNumThreads(), list(threads._THREADS), torch.get_num_threads() if torch else None)
    try:
        build_app(str(saved), options=ServeOptions(threads=1))
        assert threads.task_threads() == 1 and cv2.getNumThreads() == 1
    finally:
        cv2.setNumThreads(before[0])
        threads._THREADS[:] = before[1]
        if torch is not None:
            torch.set_num_threads(before[2])
    predictor = load_predictor(str(saved))
    assert predictor.inputs == {"image": {"image"}} and predictor.outputs == ["small"]
    photo = np.zeros((8, 6, 3), np.uint8)
    photo[:4] = 200
    small = predictor.predict({"image": [photo]})["small"][0]
    assert len(small) == 4 * 4 * 3 and max(small) == 200 and min(small) == 0
    # The suite shares one SparkSession, so whether this process has a SparkContext depends on test order;
    # a fresh interpreter shows what a server process does on its own.
    import subprocess
    import textwrap

    probe = textwrap.dedent(f"""
        import sys
        import numpy as np
        from irbis.serving.predictor import load_predictor
        predictor = load_predictor({str(saved)!r})
        predictor.predict({{"image": [np.zeros((8, 6, 3), np.uint8)]}})
        started = ("pyspark.context" in sys.modules
                   and sys.modules["pyspark"].SparkContext._active_spark_context is not None)
        print("spark-started" if started else "no-spark")
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "no-spark"
