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

How many rows a batch may hold is decided from what the batches cost, up to ``max_batch_size``: the
batcher keeps each batch size's cost per row (sizes by powers of two) and takes the smallest size whose
cost per row is within :data:`BATCH_TOLERANCE` of the best it has seen. A pipeline that gains from
batching (a tabular model, a network on a GPU) keeps large batches; one that gains nothing (a CNN on
a few CPU cores, where a batch of 64 images costs 64 times one) runs small ones, so that no request
waits behind a long batch that saves nothing. Every :data:`PROBE_EVERY` batches one batch tries half
or twice the current size, so the choice follows the load and the machine.

Requests of text (a pipeline with ``TextEmbedder`` or ``TextClassifierModel``) are grouped by length twice.
Within one pipeline call, the text stage's kernel sorts the texts by token length and cuts them into batches
under its ``tokenBudget`` (:func:`irbis.kernels.sequences.run_by_length`), so a short text is never padded to
a long one. Across the calls of one drain, ``groups`` (the predictor's
:meth:`~irbis.serving.predictor.Predictor.length_groups`, given where the server runs with ``--length-groups``)
splits the drain into groups of requests under that same budget, shortest first, one call each, each group
answered as soon as it is done. Measured on drains of 16 real reviews outside the server
(``benchmarks/serve_text_groups.py``), groups of the text stages' budget (1024 tokens) answered a drain in
about the same time as one call and cut the mean wait of a request by more than a third. Under closed-loop
clients the mean cannot fall (each early answer's next request waits behind the drain's long group) and the
p99 rose (``benchmarks/serving_text.py``; the figures are on the performance page), so the server does not
group by default. The drain's cost per row, not each group's, is what the
batch size learns from.
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
#: Batch sizes whose cost per row is within this share of the best count as equally good: the
#: smallest of them is used.
BATCH_TOLERANCE = 0.10
#: Every this many batches, one tries half (then, the next time, twice) the current size.
PROBE_EVERY = 8
#: Weight of a new batch in a size's running cost per row.
COST_WEIGHT = 0.3

PredictFn = Callable[[dict[str, list[Any]]], dict[str, list[Any]]]
#: Given the columns of each request of a drain, the requests' indices in groups, one call each, in order.
GroupFn = Callable[[list[dict[str, list[Any]]]], list[list[int]]]


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
                 max_queue: int = 1024, on_batch: Callable[[int, int], None] | None = None,
                 groups: GroupFn | None = None) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError(f"maxBatchSize ({max_batch_size}) and the queue size ({max_queue}) must be "
                             f"at least 1, maxWaitMs ({max_wait_ms}) at least 0")
        self.predict, self.max_batch_size, self.max_wait = predict, max_batch_size, max_wait_ms / 1000
        self.max_queue, self.on_batch, self.groups = max_queue, on_batch, groups
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="irbis-predict")
        self._concurrent = False
        self._row_cost: float | None = None  # seconds per row of the last batch; None until one ran
        self.limit = max_batch_size  # rows the next batch may hold (see the module docstring)
        self._costs: dict[int, float] = {}  # batch size (a power of two) -> running seconds per row
        self._batches = 0
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

    @property
    def _started(self) -> asyncio.Queue[Any]:
        """The queue of a started batcher."""
        if self._queue is None:
            raise RuntimeError("the batcher has not been started")
        return self._queue

    async def start(self) -> None:
        self._queue = asyncio.Queue(self.max_queue)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Finish every request already accepted, then stop."""
        self.stopping = True
        if self._task is not None:
            await self._started.put(_STOP)
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
            first = await self._started.get()
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

    def _next_limit(self) -> int:
        """Rows for the next batch: the chosen size, or a probe of half or twice it. A size never measured
        above the chosen one is tried as soon as requests fill a batch."""
        self._batches += 1
        larger = min(self.max_batch_size, self.limit * 2)
        if self.depth >= self.limit and larger > self.limit and larger not in self._costs:
            return larger
        if self._batches % PROBE_EVERY:
            return self.limit
        down = (self._batches // PROBE_EVERY) % 2 == 1
        return max(1, self.limit // 2) if down else larger

    def _learn(self, rows: int, seconds: float) -> None:
        """Keep the cost per row of a batch of ``rows``; choose the size of the next batches."""
        size = 1 << (rows.bit_length() - 1)
        per_row = seconds / rows
        old = self._costs.get(size)
        self._costs[size] = per_row if old is None else old + COST_WEIGHT * (per_row - old)
        best = min(self._costs.values())
        good = min(b for b, c in self._costs.items() if c <= best * (1 + BATCH_TOLERANCE))
        self.limit = max(1, min(self.max_batch_size, good))

    async def _gather(self, first: _Item) -> tuple[list[_Item], bool]:
        items, rows = [first], first.rows
        limit = self._next_limit()
        deadline = asyncio.get_running_loop().time() + (self.max_wait if self._concurrent else 0)
        while rows < limit:
            try:
                item = self._started.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._started.get(), left)
                except asyncio.TimeoutError:
                    break
            if item is _STOP:
                return items, True
            items.append(item)
            rows += item.rows
        return items, False

    async def _run(self, items: list[_Item]) -> None:
        """One drain: one call, or one call per length group (``groups``), each answered when it is done."""
        plan = [list(range(len(items)))]
        if self.groups is not None and len(items) > 1:
            try:
                plan = self.groups([i.columns for i in items])
            except Exception:  # noqa: BLE001 (a request the measure cannot read fails, if at all, in the call)
                pass
        if len(plan) == 1:
            await self._run_batch(items)
            return
        start = time.perf_counter()
        for group in plan:
            waiting = [items[k] for k in group if not items[k].future.done()]
            if waiting:
                await self._run_batch(waiting, learn=False)
        self._learn(sum(i.rows for i in items), time.perf_counter() - start)

    async def _run_batch(self, items: list[_Item], learn: bool = True) -> None:
        merged = items[0].columns if len(items) == 1 else {
            c: [v for i in items for v in i.columns[c]] for c in items[0].columns}
        total = sum(i.rows for i in items)
        if self.on_batch is not None:
            self.on_batch(total, self.depth)
        try:
            out = await self._call(merged, total, learn)
        except Exception as err:  # noqa: BLE001 (handed to the request that caused it)
            if len(items) > 1:
                for item in items:
                    await self._run_batch([item], learn)
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

    async def _call(self, columns: dict[str, list[Any]], rows: int, learn: bool = True) -> dict[str, list[Any]]:
        """``predict`` on the loop when the batch is cheap (see the module docstring), else on the worker;
        ``learn``: this call's cost per row informs the batch size (not for a length group: its drain's does)."""
        start = time.perf_counter()
        if self._row_cost is not None and self._row_cost * rows < INLINE_S:
            out = self.predict(columns)
        else:
            out = await asyncio.get_running_loop().run_in_executor(self._executor, self.predict, columns)
        seconds = time.perf_counter() - start
        self._row_cost = seconds / rows
        if learn:
            self._learn(rows, seconds)
        return out


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())
