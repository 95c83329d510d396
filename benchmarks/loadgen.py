"""A closed-loop HTTP load generator: raw keep-alive HTTP/1.1 sockets on asyncio (uvloop when present).

Each of C connections sends one pre-encoded request, waits for the whole response and sends the next,
for a fixed time. A response is parsed only as far as its status line and ``Content-Length``, so the
generator costs a few microseconds per request; :func:`trivial_server` (a fixed answer, no framework)
measures that ceiling. Connections may be spread over several processes (``procs``); each process can
be pinned to given cores so that the load does not wander onto the server's.

Run as a process: ``python benchmarks/loadgen.py URL BODIES_JSON --clients C --seconds S`` prints one
JSON line (p50 and p99 in ms, requests/s, requests, errors).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import time
from urllib.parse import urlsplit

import numpy as np

__all__ = ["encode_requests", "run", "trivial_server"]


def encode_requests(url: str, bodies: list[tuple[bytes, str]], path: str = "/predict") -> list[bytes]:
    """Every request as the bytes sent on the wire (HTTP/1.1, keep-alive)."""
    host = urlsplit(url).netloc
    return [f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}"
            f"\r\n\r\n".encode() + body for body, ctype in bodies]


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``request`` sends bytes and waits for the status of the answer."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15:].split(b"\r\n")[0]) if at >= 0 else 0
        if len(self.buffer) >= end + 4 + length:
            status = int(self.buffer[9:12])
            del self.buffer[:end + 4 + length]
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the server closed the connection"))

    async def request(self, data: bytes) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


async def _load(url: str, requests: list[bytes], clients: int, seconds: float, offset: int) -> dict:
    parts = urlsplit(url)
    loop = asyncio.get_running_loop()
    conns = [(await loop.create_connection(_Connection, parts.hostname, parts.port))[1] for _ in range(clients)]
    for conn in conns[:1]:
        await conn.request(requests[0])  # warm-up
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def client(k: int, conn: _Connection) -> None:
        nonlocal errors
        i = offset + k
        clock = time.perf_counter
        while clock() < stop:
            start = clock()
            status = await conn.request(requests[i % len(requests)])
            latencies.append(clock() - start)
            errors += status != 200
            i += clients
    began = time.perf_counter()
    await asyncio.gather(*[client(k, c) for k, c in enumerate(conns)])
    wall = time.perf_counter() - began
    for conn in conns:
        conn.transport.close()
    return {"latencies": latencies, "errors": errors, "wall": wall}


def _process(url: str, requests: list[bytes], clients: int, seconds: float, offset: int,
             cores: list[int] | None, out: mp.Queue) -> None:
    if cores:
        os.sched_setaffinity(0, cores)
    try:
        import uvloop
        result = uvloop.run(_load(url, requests, clients, seconds, offset))
    except ImportError:
        result = asyncio.run(_load(url, requests, clients, seconds, offset))
    out.put(result)


def run(url: str, bodies: list[tuple[bytes, str]], clients: int, seconds: float, procs: int = 1,
        cores: list[int] | None = None, path: str = "/predict") -> dict:
    """Keep ``clients`` requests in flight for ``seconds`` from ``procs`` processes; the figures."""
    requests = encode_requests(url, bodies, path)
    procs = max(1, min(procs, clients))
    shares = [clients // procs + (k < clients % procs) for k in range(procs)]
    out: mp.Queue = mp.get_context("spawn").Queue()
    workers = [mp.get_context("spawn").Process(target=_process, args=(url, requests, n, seconds, sum(shares[:k]),
                                                                       cores, out)) for k, n in enumerate(shares)]
    for w in workers:
        w.start()
    results = [out.get() for _ in workers]
    for w in workers:
        w.join()
    ms = np.array([x for r in results for x in r["latencies"]]) * 1000
    wall = max(r["wall"] for r in results)
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "rps": len(ms) / wall,
            "requests": int(len(ms)), "errors": int(sum(r["errors"] for r in results))}


class _Fixed(asyncio.Protocol):
    ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buffer = transport, bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(self.buffer[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15:].split(b"\r\n")[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            del self.buffer[:end + 4 + length]
            self.transport.write(self.ANSWER)


def trivial_server(port: int) -> None:
    """Answer every request with ``{}`` at once (no framework): the ceiling of the generator."""
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Fixed, "127.0.0.1", port)
        await server.serve_forever()
    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("bodies", help="JSON file: a list of [hex body, content type]")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--cores", default="", help="cores to pin the load to, e.g. 1 or 0,1")
    args = parser.parse_args()
    with open(args.bodies) as f:
        bodies = [(bytes.fromhex(b), t) for b, t in json.load(f)]
    cores = [int(c) for c in args.cores.split(",") if c] or None
    print(json.dumps(run(args.url, bodies, args.clients, args.seconds, args.procs, cores)))


if __name__ == "__main__":
    main()
