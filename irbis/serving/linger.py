"""Lingering close: an answer given before the request's body is in still reaches the client.

A server that refuses a request early (413 for a body over the limit, 401, 404) and then closes its
socket while the client is still sending makes the kernel answer the unread bytes with a reset, and a
reset throws away the answer waiting in the client's receive buffer: a client that sends its whole
body before reading (Python's ``urllib``, a plain socket) sees "connection reset" or "broken pipe"
instead of the 413. Uvicorn has no remedy of its own, so this module gives it one at its protocol
layer, the way nginx does (its ``lingering_close``):

* an answer that starts before the request's body has all arrived carries ``Connection: close``
  (RFC 9112 §9.6: the server says it will not read the rest and then serve another request on the
  connection);
* when uvicorn then closes the connection, the protocol instead shuts down its sending side (the client
  reads the answer and then the end of the stream), keeps reading and discards what the client still
  sends, and closes once the client closes, or after :data:`LINGER_S` seconds or
  :func:`linger_bytes` bytes, whichever comes first. The discarded bytes are never kept, so a
  lingering connection holds no memory, and both bounds keep what a client can make the server read.

A client that sent ``Expect: 100-continue`` and is refused gets its answer before sending the body
(uvicorn sends ``100 Continue`` only when the app reads the body), and the connection closes as soon as
the client closes its side.

:func:`http_protocol` gives uvicorn's ``http`` setting: httptools' protocol (uvicorn's choice when it is
installed), else h11's, each with lingering close.
"""
from __future__ import annotations

import asyncio
from functools import partial
from typing import Any, Callable, cast

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: uvicorn itself would use h11
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

__all__ = ["LINGER_S", "LingeringH11Protocol", "http_protocol", "linger_bytes"]

#: The longest a refused connection is read and discarded before it is closed (nginx lingers 30 s).
LINGER_S = 2.0
#: The fewest bytes a refused connection may discard, whatever the body limit.
LINGER_FLOOR_BYTES = 128 * 1024 * 1024
_CLOSE = (b"connection", b"close")


def linger_bytes(max_body_bytes: int) -> int:
    """Bytes a refused connection reads and discards at most: 4x the body limit, and at least 128 MiB
    (a client sending a body many times the limit still reads its 413 on a fast link)."""
    return max(4 * max_body_bytes, LINGER_FLOOR_BYTES)


class _Transport:
    """The connection's transport as the uvicorn protocol sees it: ``close`` asks the protocol whether to
    linger first; everything else goes to the real transport."""

    def __init__(self, transport: asyncio.Transport, protocol: "_Lingering") -> None:
        self._transport, self._protocol = transport, protocol

    def close(self) -> None:
        if self._protocol._lingering:
            return  # the lingering ends by itself, within its bounds
        if not self._protocol._start_lingering():
            self._transport.close()

    def is_closing(self) -> bool:
        return self._protocol._lingering or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Lingering:
    """The lingering close, mixed into one of uvicorn's HTTP/1.1 protocols (see the module docstring)."""

    cycle: Any
    flow: Any
    loop: asyncio.AbstractEventLoop

    def __init__(self, *args: Any, linger_bytes: int = LINGER_FLOOR_BYTES, linger_s: float = LINGER_S,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._linger_left, self._linger_s = linger_bytes, linger_s
        self._lingering = False
        self._raw: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        super().connection_made(_Transport(self._raw, self))  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._linger_left -= len(data)
            if self._linger_left <= 0:
                self._stop_lingering()
            return
        super().data_received(data)  # type: ignore[misc]
        self._watch_new()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._watch_new()  # a pipelined request may start here

    def eof_received(self) -> None:
        if self._lingering:
            self._stop_lingering()  # the client has sent all it will: nothing more to discard

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _watch_new(self) -> None:
        """Watch the requests parsed since the last call (their apps have not run yet)."""
        for cycle in [self.cycle, *(c for c, _ in getattr(self, "pipeline", ()))]:
            if cycle is not None and not getattr(cycle, "_irbis_watched", False):
                self._watch(cycle)

    @staticmethod
    def _watch(cycle: Any) -> None:
        """Make ``cycle`` say ``Connection: close`` if its answer starts before its body is in."""
        cycle._irbis_watched = True
        send = cycle.send

        async def send_closing(message: Any) -> None:
            if message["type"] == "http.response.start" and cycle.more_body:
                headers = list(message.get("headers", []))
                if _CLOSE not in headers:
                    message = {**message, "headers": headers + [_CLOSE]}
            await send(message)

        cycle.send = send_closing

    def _start_lingering(self) -> bool:
        """On uvicorn's close: linger (True) if the last answer went out before its request's body was in."""
        cycle, raw = self.cycle, self._raw
        if raw is None or raw.is_closing() or cycle is None or not cycle.response_complete or not cycle.more_body:
            return False
        self._lingering = True
        cycle.body = bytearray()  # what was read of the body is no longer wanted
        if raw.can_write_eof():
            raw.write_eof()  # after the answer: the client reads it, then the end of the stream
        self.flow.resume_reading()
        self._timer = self.loop.call_later(self._linger_s, self._stop_lingering)
        return True

    def _stop_lingering(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._raw is not None and not self._raw.is_closing():
            self._raw.close()


class LingeringH11Protocol(_Lingering, H11Protocol):
    """Uvicorn's h11 protocol with lingering close."""


if HttpToolsProtocol is not None:
    class LingeringHttpToolsProtocol(_Lingering, HttpToolsProtocol):
        """Uvicorn's httptools protocol (its choice where httptools is installed) with lingering close."""


def http_protocol(max_body_bytes: int) -> Callable[..., asyncio.Protocol]:
    """Uvicorn's ``http`` setting for a server whose request bodies are limited to ``max_body_bytes``: its
    HTTP/1.1 protocol (httptools if installed, else h11) with lingering close (see the module docstring).
    A ``partial`` of a module-level class, so a ``--workers`` server can hand it to its processes."""
    base = LingeringHttpToolsProtocol if HttpToolsProtocol is not None else LingeringH11Protocol
    return partial(base, linger_bytes=linger_bytes(max_body_bytes), linger_s=LINGER_S)
