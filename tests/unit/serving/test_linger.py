"""A body over the limit gets a 413 that the client can read, whether or not it stops sending.

The server answers before reading such a body, so it closes by lingering (:mod:`irbis.serving.linger`):
it reads and discards what the client still sends (bounded in bytes and time) before closing. Every test
runs on both of uvicorn's HTTP/1.1 protocols (httptools, its choice where installed, and h11).
"""
from __future__ import annotations

import http.client
import json
import pickle
import socket
import time
import urllib.error
import urllib.request
from functools import partial
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from irbis.kernels.chain import KernelChain, StageKernel
from irbis.serving import linger
from irbis.serving.app import ServeOptions, make_app
from irbis.serving.predictor import Predictor
from irbis.serving.server import BackgroundServer

LIMIT = 1 << 20
BIG = 64 << 20
PROTOCOLS = {"h11": linger.LingeringH11Protocol}
if linger.HttpToolsProtocol is not None:
    PROTOCOLS["httptools"] = linger.LingeringHttpToolsProtocol


def _app(**options):
    def run(blocks):
        return {"twice": np.asarray(blocks["a"], np.float64) * 2}
    predictor = Predictor(KernelChain([StageKernel(["a"], ["twice"], run, nulls=False,
                                                   kinds={"a": frozenset({"number"})})]))
    return make_app(predictor, ServeOptions(max_body_bytes=LIMIT, **options))


@pytest.fixture(scope="module", params=sorted(PROTOCOLS))
def url(request):
    http = partial(PROTOCOLS[request.param], linger_bytes=linger.linger_bytes(LIMIT), linger_s=linger.LINGER_S)
    with BackgroundServer(_app(), http=http) as url:
        yield url


def _still_answers(url: str, after: str) -> None:
    """The next request, on a new connection, is answered (its delay printed, never asserted)."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection(*_address(url), timeout=30)
    try:
        connection.request("POST", "/predict", b'{"a": 2}', {"Content-Type": "application/json"})
        answer = connection.getresponse()
        status, body = answer.status, answer.read()
    finally:
        connection.close()
    print(f"next answer {1000 * (time.perf_counter() - start):.1f} ms after {after}")
    assert status == 200 and json.loads(body) == {"twice": 4.0}


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def _head(length: int, *extra: str) -> bytes:
    lines = ["POST /predict HTTP/1.1", "Host: test", "Content-Type: application/json",
             f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One answer off ``sock``: status, headers (lower-case names) and the body its Content-Length says."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the connection ended inside the answer"
        body += chunk
    return int(status_line.split()[1]), headers, body


def test_urllib_sending_a_body_over_the_limit_reads_the_413(url):
    """urllib sends its whole body before it reads (and says Connection: close)."""
    request = urllib.request.Request(f"{url}/predict", data=bytes(BIG), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    error = json.loads(refused.value.read())["error"]
    assert f"body of {BIG} bytes is over the limit of {LIMIT} bytes" == error
    _still_answers(url, "urllib's 64 MiB body")


def test_a_raw_socket_sending_a_body_over_the_limit_reads_the_413(url):
    with socket.create_connection(_address(url), timeout=60) as sock:
        sock.sendall(_head(BIG) + bytes(BIG))
        status, headers, body = _read_answer(sock)
        assert status == 413 and "over the limit" in json.loads(body)["error"]
        assert headers["connection"] == "close"  # the server read the body only to throw it away
        assert sock.recv(1) == b""  # then the server closed its side
    _still_answers(url, "a raw socket's 64 MiB body")


def test_a_body_sent_in_chunks_over_the_limit_reads_the_413(url):
    """No Content-Length: the limit trips while the body streams in."""
    chunk = bytes(256 << 10)
    framed = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(BIG // len(chunk))) + b"0\r\n\r\n"
    head = (b"POST /predict HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    with socket.create_connection(_address(url), timeout=60) as sock:
        sock.sendall(head + framed)
        status, _, body = _read_answer(sock)
    assert status == 413 and json.loads(body)["error"] == f"body is over the limit of {LIMIT} bytes"
    _still_answers(url, "a chunked 64 MiB body")


def test_expect_100_continue_gets_the_413_before_sending_the_body(url):
    with socket.create_connection(_address(url), timeout=60) as sock:
        sock.sendall(_head(BIG, "Expect: 100-continue"))
        status, headers, body = _read_answer(sock)  # read before a byte of the body is sent
        assert status == 413 and headers["connection"] == "close"  # no 100 Continue came first
        assert "over the limit" in json.loads(body)["error"]
        _still_answers(url, "an Expect: 100-continue refusal (its connection still lingering)")


def test_expect_100_continue_within_the_limit_is_served(url):
    body = b'{"a": 3}'
    with socket.create_connection(_address(url), timeout=60) as sock:
        sock.sendall(_head(len(body), "Expect: 100-continue"))
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        status, headers, answer = _read_answer(sock)
    assert status == 200 and json.loads(answer) == {"twice": 6.0} and headers.get("connection") != "close"


def test_answers_after_a_whole_body_keep_the_connection(url):
    with httpx.Client(timeout=30) as client:
        answers = [client.post(f"{url}/predict", json={"a": i}) for i in range(3)]
    assert [a.json()["twice"] for a in answers] == [0.0, 2.0, 4.0]
    assert all("close" not in a.headers.get("connection", "") for a in answers)


def _sends_until_closed(sock: socket.socket, deadline_s: float = 30) -> bool:
    """Keep sending until the server ends the connection (True), or give up after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            sock.sendall(bytes(64 << 10))
        except OSError:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_lingering_is_bounded_in_bytes(name):
    """A client that sends past the bound is cut off: the discarding ends."""
    http = partial(PROTOCOLS[name], linger_bytes=4 * LIMIT, linger_s=60)
    with BackgroundServer(_app(), http=http) as url, socket.create_connection(_address(url), timeout=60) as sock:
        sock.sendall(_head(10 ** 12))
        status, _, _ = _read_answer(sock)
        assert status == 413
        assert _sends_until_closed(sock)
        _still_answers(url, "a connection cut off at its byte bound")


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_lingering_is_bounded_in_time(name):
    """A client that trickles its body is cut off once the lingering time is up."""
    http = partial(PROTOCOLS[name], linger_bytes=10 ** 12, linger_s=0.2)
    with BackgroundServer(_app(), http=http) as url, socket.create_connection(_address(url), timeout=60) as sock:
        sock.sendall(_head(10 ** 12))
        status, _, _ = _read_answer(sock)
        assert status == 413
        assert sock.recv(1) == b""  # the server shut its side once the answer was out
        assert _sends_until_closed(sock)
        _still_answers(url, "a connection cut off at its time bound")


def test_the_servers_protocol_lingers_by_the_body_limit():
    setting = linger.http_protocol(64 << 20)
    assert setting.keywords == {"linger_bytes": 256 << 20, "linger_s": linger.LINGER_S}
    assert linger.linger_bytes(1) == linger.LINGER_FLOOR_BYTES
    assert pickle.loads(pickle.dumps(setting)).func is setting.func  # a --workers server sends it to its processes
    app = _app()
    server = BackgroundServer(app)
    assert server.config.http.keywords["linger_bytes"] == linger.linger_bytes(LIMIT)
