"""Micro-batching: concurrent requests gathered into one call of the pipeline (asyncio, no framework).

Requests wait in a bounded queue; one loop takes the first, adds every request already waiting (up
to ``max_batch_size`` rows) and runs the pipeline once on all of them. A lone request is therefore
never delayed; under load the batches grow by themselves. ``max_wait_ms`` lets the loop wait that long
for more requests, but only while requests arrive concurrently (the last batch held more than one).
A batch that the last one's cost per row says takes under :data:`INLINE_S` runs on the event loop
itself (a thread hop costs more than a small tabular pipeline); any other runs on one long-lived
worker thread, while the loop goes on reading requests. A request that finds the batcher idle (nothing
queued, no batch running) may instead hand its whole work, decoding included, to that worker thread
at once (:meth:`Batcher.run_alone`): one thread hop instead of three. A full queue refuses new requests
(:class:`Overloaded`); a batch that fails is run again request by request, so one bad request fails
alone. A request's timeout is one timer on its future, no task of its own.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["INLINE_S", "Batcher", "Overloaded"]

#: Seconds a batch may be expected to take and still run on the event loop, without a thread hop.
INLINE_S = 0.0005

PredictFn = Callable[[dict[str, list[Any]]], dict[str, list[Any]]]


class Overloaded(RuntimeError):
    """The queue is full (or the server is stopping): answer 503 and ask the client to retry."""


@dataclass
class _Item:
    columns: dict[str, list[Any]]
    rows: int
    future: asyncio.Future = field(repr=False)


_STOP = object()


class Batcher:
    """Gather requests into batches and run ``predict`` on them (see the module docstring)."""

    def __init__(self, predict: PredictFn, max_batch_size: int = 64, max_wait_ms: float = 2.0,
                 max_queue: int = 1024, on_batch: Callable[[int, int], None] | None = None) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError(f"maxBatchSize ({max_batch_size}) and the queue size ({max_queue}) must be "
                             f"at least 1, maxWaitMs ({max_wait_ms}) at least 0")
        self.predict, self.max_batch_size, self.max_wait = predict, max_batch_size, max_wait_ms / 1000
        self.max_queue, self.on_batch = max_queue, on_batch
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="irbis-predict")
        self._concurrent = False
        self._row_cost: float | None = None  # seconds per row of the last batch; None until one ran
        self._busy = 0  # batches and lone requests running or handed to the worker
        self.stopping = False

    @property
    def depth(self) -> int:
        """Requests waiting in the queue."""
        return self._queue.qsize() if self._queue is not None else 0

    @property
    def idle(self) -> bool:
        """Whether no request is waiting and none is running: a new one would be alone."""
        return not self._busy and self._queue is not None and self._queue.empty() and not self.stopping

    async def run_alone(self, work: Callable[[], Any], timeout: float | None = None) -> Any:
        """``work()`` (a request's decoding and pipeline call) on the worker thread, in one hop.

        Meant for a request that found the batcher :attr:`idle`; requests arriving meanwhile are
        batched as usual and run after it (the worker runs one thing at a time).
        """
        if self.stopping or self._queue is None:
            raise Overloaded("the server is stopping")
        self._busy += 1
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, work)
            return await asyncio.wait_for(future, timeout)
        finally:
            self._busy -= 1

    async def start(self) -> None:
        self._queue = asyncio.Queue(self.max_queue)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Finish every request already accepted, then stop."""
        self.stopping = True
        if self._task is not None:
            await self._queue.put(_STOP)
            await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, columns: dict[str, list[Any]], rows: int, timeout: float | None = None) -> Any:
        """Queue one request; its outputs, or :class:`Overloaded`, ``TimeoutError`` or its own error."""
        if self.stopping or self._queue is None:
            raise Overloaded("the server is stopping")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        try:
            self._queue.put_nowait(_Item(columns, rows, future))
        except asyncio.QueueFull:
            raise Overloaded(f"{self.max_queue} requests are waiting") from None
        timer = None if timeout is None else loop.call_later(timeout, _expire, future)
        try:
            return await future  # the loop skips an expired request if it has not run yet
        finally:
            if timer is not None:
                timer.cancel()

    async def _loop(self) -> None:
        while True:
            first = await self._queue.get()
            if first is _STOP:
                return
            items, stop = await self._gather(first)
            items = [i for i in items if not i.future.done()]
            if items:
                self._busy += 1
                try:
                    await self._run(items)
                finally:
                    self._busy -= 1
            self._concurrent = len(items) > 1
            if stop:
                return

    async def _gather(self, first: _Item) -> tuple[list[_Item], bool]:
        items, rows = [first], first.rows
        deadline = asyncio.get_running_loop().time() + (self.max_wait if self._concurrent else 0)
        while rows < self.max_batch_size:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), left)
                except asyncio.TimeoutError:
                    break
            if item is _STOP:
                return items, True
            items.append(item)
            rows += item.rows
        return items, False

    async def _run(self, items: list[_Item]) -> None:
        merged = items[0].columns if len(items) == 1 else {
            c: [v for i in items for v in i.columns[c]] for c in items[0].columns}
        total = sum(i.rows for i in items)
        if self.on_batch is not None:
            self.on_batch(total, self.depth)
        try:
            out = await self._call(merged, total)
        except Exception as err:  # noqa: BLE001 (handed to the request that caused it)
            if len(items) > 1:
                for item in items:
                    await self._run([item])
            elif not items[0].future.done():
                items[0].future.set_exception(err)
            return
        if len(items) == 1:
            if not items[0].future.done():
                items[0].future.set_result(out)
            return
        start = 0
        for item in items:
            if not item.future.done():
                item.future.set_result({c: v[start:start + item.rows] for c, v in out.items()})
            start += item.rows

    async def _call(self, columns: dict[str, list[Any]], rows: int) -> dict[str, list[Any]]:
        """``predict`` on the loop when the batch is cheap (see the module docstring), else on the worker."""
        start = time.perf_counter()
        if self._row_cost is not None and self._row_cost * rows < INLINE_S:
            out = self.predict(columns)
        else:
            out = await asyncio.get_running_loop().run_in_executor(self._executor, self.predict, columns)
        self._row_cost = (time.perf_counter() - start) / rows
        return out


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())
