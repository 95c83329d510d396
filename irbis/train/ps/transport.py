"""The parameter server's wire: ZeroMQ sockets, a fixed binary header, raw tensor frames.

Why ZeroMQ (``pyzmq``) rather than gRPC: it is brokerless (a shard server is one
ROUTER socket in a thread of the training task, nothing else to run); it moves raw
multipart frames, so a tensor crosses as its own buffer behind a ``struct`` header,
sent zero-copy from the numpy view of the flat gradient and received into the flat
weight buffer with one copy, where gRPC would wrap it in protobuf messages; it has
authentication built in (CURVE, ZAP) should a deployment want encryption on top of
the per-message MAC used here; and it is a small, well-kept dependency with wheels
for every platform Spark runs on.

Every message is three frames: the header (:data:`HEADER`), the payload (float32
weights or gradients, or int64 counters; empty for requests without one) and a
keyed BLAKE2b MAC of header and payload under the job's secret. The secret is made
by rank 0 and handed to the workers through the job's rendezvous, never written
anywhere. A message whose MAC does not verify is refused (and counted in
:attr:`ShardServer.refused`); nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import threading
from collections.abc import Callable, Sequence

import numpy as np
import zmq

from irbis.train.ps.shard import APPLIED, ShardState

HEADER = struct.Struct("<4sBBHIIqqdQ")  # magic, op, status, flags, worker, shard, seq, version, lr, numel
MAGIC = b"IRPS"
HELLO, PULL, PUSH, STATS, CONTROL = 1, 2, 3, 4, 5
OK, REFUSED, BAD_REQUEST = 0, 10, 11
WANT_PULL = 1
MAC_BYTES = 32


def _mac(secret: bytes, header: bytes, payload: memoryview | bytes) -> bytes:
    h = hashlib.blake2b(key=secret, digest_size=MAC_BYTES)
    h.update(header)
    h.update(payload)
    return h.digest()


def _frames(secret: bytes, op: int, status: int = OK, flags: int = 0, worker: int = 0, shard: int = 0,
            seq: int = 0, version: int = 0, lr: float = 0.0, payload: np.ndarray | None = None) -> list:
    body = memoryview(b"") if payload is None else memoryview(np.ascontiguousarray(payload).data).cast("B")
    header = HEADER.pack(MAGIC, op, status, flags, worker, shard, seq, version, lr, len(body))
    return [header, body, _mac(secret, header, body)]


def _verify(secret: bytes, frames: list) -> tuple | None:
    """The unpacked header if the frames are a well-formed message with a valid MAC, else None."""
    if len(frames) != 3 or len(frames[0].bytes) != HEADER.size:
        return None
    header, body = frames[0].bytes, frames[1].buffer
    if not hmac.compare_digest(_mac(secret, header, body), frames[2].bytes):
        return None
    fields = HEADER.unpack(header)
    return fields if fields[0] == MAGIC and fields[9] == len(body) else None


class ShardServer:
    """Serve some shards from a ROUTER socket in a daemon thread, bound to ``host``.

    Parameters
    ----------
    shards : dict of int to ShardState
        The shards this server hosts, by global shard index.
    secret : bytes
        The job's secret; messages without its MAC are refused.
    host : str
        The address Spark gave this task (``127.0.0.1`` locally); the port is picked free.
    on_control : callable, optional
        ``f(command, step)``, run in the serving thread for a CONTROL message (a dedicated server's
        checkpoint cut or end, see :mod:`irbis.train.ps.dedicated`); the reply is sent once it returns.
    """

    def __init__(self, shards: dict[int, ShardState], secret: bytes, host: str = "127.0.0.1",
                 on_control: Callable[[int, int], None] | None = None) -> None:
        self.shards, self.secret, self.on_control = shards, secret, on_control
        self.refused = 0
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        port: int = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="irbis-ps-shard")
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(50):
                frames = self._sock.recv_multipart(copy=False)
                self._handle(frames[0].bytes, frames[1:])
        self._sock.close()

    def _send(self, ident: bytes, **kw) -> None:
        self._sock.send_multipart([ident, *_frames(self.secret, **kw)], copy=False)

    def _handle(self, ident: bytes, frames: list) -> None:
        fields = _verify(self.secret, frames)
        if fields is None:
            self.refused += 1
            self._sock.send_multipart([ident, HEADER.pack(MAGIC, 0, REFUSED, 0, 0, 0, 0, 0, 0.0, 0), b"", b""])
            return
        _, op, _, flags, worker, sid, seq, version, lr, _ = fields
        shard = self.shards.get(sid)
        if shard is None or op not in (HELLO, PULL, PUSH, STATS, CONTROL) or (op == CONTROL and not self.on_control):
            self._send(ident, op=op, status=BAD_REQUEST, shard=sid)
        elif op == CONTROL:
            assert self.on_control is not None  # refused above when there is none
            self.on_control(seq, version)
            self._send(ident, op=op, shard=sid, version=shard.version)
        elif op == HELLO:  # the shard's size and version, and the last push it applied from this worker
            self._send(ident, op=op, shard=sid, version=shard.version, seq=shard.weights.size,
                       payload=np.array([shard.last_seq.get(worker, 0)], dtype=np.int64))
        elif op == STATS:
            self._send(ident, op=op, shard=sid, payload=shard.stats())
        elif op == PULL:
            self._reply_pull(ident, op, sid, worker, True)
        else:
            grad = np.frombuffer(frames[1].buffer, dtype=np.float32)
            status = shard.push(worker, seq, version, grad, lr)
            self._reply_pull(ident, op, sid, worker, bool(flags & WANT_PULL), 0 if status == APPLIED else status)

    def _reply_pull(self, ident: bytes, op: int, sid: int, worker: int, want: bool, status: int = OK) -> None:
        shard = self.shards[sid]
        if want:
            version, weights = shard.pull(worker)
            self._send(ident, op=op, status=status, shard=sid, version=version, payload=weights)
        else:
            self._send(ident, op=op, status=status, shard=sid, version=shard.version)

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._stop.set()
        self._thread.join(timeout=5)


class PSClient:
    """A worker's connection to every shard (one DEALER socket per server).

    Parameters
    ----------
    addresses : sequence of str
        The server address of each shard, by shard index.
    ranges : sequence of (int, int)
        Each shard's ``[lo, hi)`` range of the flat buffer.
    secret : bytes
    worker : int
        This worker's rank.
    timeout_s : float
        How long a reply may take.
    """

    #: Workers push whenever they are ready; none waits for another's turn.
    free_running = True

    def __init__(self, addresses: Sequence[str], ranges: Sequence[tuple[int, int]], secret: bytes, worker: int,
                 timeout_s: float = 600.0) -> None:
        self.ranges, self.secret, self.worker, self.timeout_ms = list(ranges), secret, worker, int(timeout_s * 1000)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socks: dict[str, zmq.Socket] = {}
        for addr in dict.fromkeys(addresses):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(addr)
            self._socks[addr] = sock
        self._route = [self._socks[a] for a in addresses]
        self._addresses = list(addresses)
        self.versions = [0] * len(ranges)
        self.seq = 0
        self.rejected = 0

    def hello(self, timeout_s: float = 10.0) -> None:
        """Check that every shard answers, before training starts; ValueError names the one that does not.

        A worker retried after it died rejoins here: it continues its sequence numbers after the last
        push a shard applied from it, so that its new pushes are applied, not taken for replays.
        """
        for sid, sock in enumerate(self._route):
            sock.send_multipart(_frames(self.secret, HELLO, worker=self.worker, shard=sid), copy=False)
            if not sock.poll(int(timeout_s * 1000)):
                raise ValueError(f"parameter server {self._addresses[sid]} (shard {sid}) did not answer within "
                                 f"{timeout_s:g} s; check that the address is reachable from this worker")
            fields, body = self._receive(sock)
            lo, hi = self.ranges[sid]
            if fields[6] != hi - lo:
                raise ValueError(f"shard {sid} at {self._addresses[sid]} holds {fields[6]} weights, expected {hi - lo}")
            last = np.frombuffer(body, dtype=np.int64)
            self.seq = max(self.seq, int(last[0]) if len(last) else 0)
            self.versions[sid] = fields[7]

    def _receive(self, sock: zmq.Socket) -> tuple[tuple, memoryview]:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 3 and HEADER.unpack(frames[0].bytes)[2] == REFUSED:
            raise PermissionError("the parameter server refused the connection: wrong or missing job secret")
        fields = _verify(self.secret, frames)
        if fields is None:
            raise PermissionError("a reply from the parameter server failed authentication")
        return fields, frames[1].buffer

    def _gather(self, out: np.ndarray | None) -> list[np.ndarray]:
        """Wait for one reply per shard; copies pulled weights into ``out``; returns the payloads."""
        poller = zmq.Poller()
        for s in self._socks.values():
            poller.register(s, zmq.POLLIN)
        payloads: list[np.ndarray] = [np.empty(0)] * len(self.ranges)
        left = len(self.ranges)
        while left:
            ready = dict(poller.poll(self.timeout_ms))
            if not ready:
                raise TimeoutError(f"the parameter server did not answer within {self.timeout_ms / 1000:g} s")
            for sock in ready:
                fields, body = self._receive(sock)
                op, status, sid, version = fields[1], fields[2], fields[5], fields[7]
                if status == BAD_REQUEST:
                    raise ValueError(f"shard {sid} rejected request op={op} as malformed")
                self.rejected += status != OK
                self.versions[sid] = version
                payloads[sid] = np.frombuffer(body, dtype=np.int64 if op == STATS else np.float32)
                if out is not None and len(body):
                    lo, hi = self.ranges[sid]
                    out[lo:hi] = payloads[sid]
                left -= 1
        return payloads

    def push(self, grads: np.ndarray, lr: float, pull_into: np.ndarray | None = None) -> None:
        """Send each shard its range of ``grads``; with ``pull_into``, copy the updated weights back into it."""
        self.seq += 1
        flags = WANT_PULL if pull_into is not None else 0
        for sid, (lo, hi) in enumerate(self.ranges):
            self._route[sid].send_multipart(_frames(self.secret, PUSH, flags=flags, worker=self.worker, shard=sid,
                                                    seq=self.seq, version=self.versions[sid], lr=lr,
                                                    payload=grads[lo:hi]), copy=False)
        self._gather(pull_into)

    def pull(self, into: np.ndarray) -> None:
        """Copy every shard's current weights into ``into`` (the flat weight buffer)."""
        for sid in range(len(self.ranges)):
            self._route[sid].send_multipart(_frames(self.secret, PULL, worker=self.worker, shard=sid), copy=False)
        self._gather(into)

    def stats(self, shard_ids: Sequence[int]) -> np.ndarray:
        """The summed counters of ``shard_ids`` (see :meth:`ShardState.stats`)."""
        total = None
        for sid in shard_ids:
            self._route[sid].send_multipart(_frames(self.secret, STATS, worker=self.worker, shard=sid), copy=False)
            fields, body = self._receive(self._route[sid])
            part = np.frombuffer(body, dtype=np.int64)
            total = part.copy() if total is None else total + part
        return total if total is not None else np.zeros(0, dtype=np.int64)

    def control(self, command: int, step: int, shard_ids: Sequence[int]) -> None:
        """Send a CONTROL message to the server of each of ``shard_ids`` and wait for each reply, in turn."""
        for sid in shard_ids:
            self._route[sid].send_multipart(_frames(self.secret, CONTROL, worker=self.worker, shard=sid,
                                                    seq=command, version=step), copy=False)
            if not self._route[sid].poll(self.timeout_ms):
                raise TimeoutError(f"parameter server {self._addresses[sid]} did not answer within "
                                   f"{self.timeout_ms / 1000:g} s")
            fields, _ = self._receive(self._route[sid])
            if fields[2] == BAD_REQUEST:
                raise ValueError(f"shard {sid} at {self._addresses[sid]} serves no control messages")

    def leave(self) -> None:
        """Nothing to do: no worker waits for another's turn (:attr:`free_running`)."""

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()


__all__ = ["HEADER", "PSClient", "ShardServer"]
