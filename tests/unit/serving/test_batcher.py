"""The batcher alone, on asyncio: where a batch runs, a lone request's wait, timeouts and batching."""
from __future__ import annotations

import asyncio
import threading
import time
import types

import pytest

from irbis.serving.batcher import Batcher


def _recorder(delay: float = 0.0):
    calls: list[tuple[str, int]] = []

    def predict(columns):
        calls.append((threading.current_thread().name, len(columns["a"])))
        time.sleep(delay)
        return {"b": [v * 2 for v in columns["a"]]}
    return predict, calls


def _clocked(monkeypatch, predict, cost: float):
    """``predict`` as the batcher sees it on a simulated clock: each call advances the batcher's clock by exactly
    ``cost`` seconds, whatever the call, a thread hand-off or a loaded machine take."""
    import irbis.serving.batcher as batcher_module

    clock = [0.0]
    monkeypatch.setattr(batcher_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def timed(columns):
        out = predict(columns)
        clock[0] += cost
        return out
    return timed


async def _with(batcher: Batcher, body):
    await batcher.start()
    try:
        return await body()
    finally:
        await batcher.stop()


def test_cheap_batches_run_on_the_loop_and_slow_ones_on_the_worker(monkeypatch):
    """The first call runs on the worker (no cost known yet); once a call's cost per row is known to be under
    INLINE_S the next ones run on the loop, and a pipeline above it stays on the worker. The costs are those of
    the batcher's simulated clock (nothing for the cheap pipeline, 10 ms for the slow one), not the wall time
    of the calls, which includes the thread hand-off and grows on a loaded machine."""
    cheap, cheap_calls = _recorder()
    slow, slow_calls = _recorder()

    async def ten(batcher):
        return [await batcher.submit({"a": [i]}, 1, timeout=30) for i in range(10)]

    for predict, cost in ((cheap, 0.0), (slow, 0.01)):
        batcher = Batcher(_clocked(monkeypatch, predict, cost))
        assert asyncio.run(_with(batcher, lambda: ten(batcher))) == [{"b": [2 * i]} for i in range(10)]
    loop_thread = threading.current_thread().name
    assert cheap_calls[0][0].startswith("irbis-predict")  # no cost known yet: the worker
    assert all(name == loop_thread for name, _ in cheap_calls[1:])  # then on the loop, once a call showed it cheap
    assert all(name.startswith("irbis-predict") for name, _ in slow_calls)


def test_a_lone_request_does_not_wait_for_company():
    """With ten minutes of ``max_wait_ms``, requests that come one at a time each run at once as a batch
    of one row: the batcher waits for company only after a batch that had some. Waiting would expire
    every request's timeout, a twentieth of that wait."""
    predict, calls = _recorder(delay=0.005)
    batcher = Batcher(predict, max_wait_ms=600_000)

    async def one_at_a_time():
        return [await batcher.submit({"a": [i]}, 1, timeout=30) for i in range(3)]
    assert asyncio.run(_with(batcher, one_at_a_time)) == [{"b": [2 * i]} for i in range(3)]
    assert [rows for _, rows in calls] == [1, 1, 1]


def test_concurrent_requests_share_a_batch_and_get_their_own_rows():
    predict, calls = _recorder(delay=0.02)
    batcher = Batcher(predict, max_batch_size=64)

    async def many():
        return await asyncio.gather(*[batcher.submit({"a": [i, i]}, 2, timeout=5) for i in range(20)])
    answers = asyncio.run(_with(batcher, many))
    assert answers == [{"b": [2 * i, 2 * i]} for i in range(20)]
    assert max(rows for _, rows in calls) > 2 and len(calls) < 20


def test_timeout_expires_the_request_and_the_batcher_goes_on():
    """The first request's call holds until the test releases it, after that request's timeout has expired:
    the timeout cannot lose the race to the call, however slowly the machine runs either."""
    release = threading.Event()
    calls: list[list[int]] = []

    def predict(columns):
        calls.append(list(columns["a"]))
        if columns["a"] == [1]:
            assert release.wait(60), "the test never released the first call"
        return {"b": [v * 2 for v in columns["a"]]}
    batcher = Batcher(predict)

    async def late_then_fine():
        try:
            with pytest.raises(asyncio.TimeoutError):
                await batcher.submit({"a": [1]}, 1, timeout=0.05)
        finally:
            release.set()
        return await batcher.submit({"a": [2]}, 1, timeout=30)
    assert asyncio.run(_with(batcher, late_then_fine)) == {"b": [4]}
    assert calls == [[1], [2]]


def test_a_lone_request_runs_whole_on_the_worker_and_later_ones_queue_behind_it():
    """The lone request's work holds the worker until the test releases it, and the test releases it only once
    the three later requests have been gathered into one batch (the batcher's ``on_batch`` hook): they are
    certain to have come while the worker was taken, whatever the machine's load."""
    predict, calls = _recorder()
    order: list[str] = []
    started, release = threading.Event(), threading.Event()
    batched = asyncio.Event()
    batcher = Batcher(predict, on_batch=lambda rows, depth: batched.set())

    def alone():
        order.append("alone:" + threading.current_thread().name)
        started.set()
        assert release.wait(60), "the test never released the lone request"
        return predict({"a": [5]})

    async def body():
        assert batcher.idle
        lone = asyncio.create_task(batcher.run_alone(alone, timeout=60))
        try:
            assert await asyncio.to_thread(started.wait, 60), "the lone request never reached the worker"
            assert not batcher.idle  # the worker is taken: new requests take the batched path
            queued = asyncio.gather(*[batcher.submit({"a": [i]}, 1, timeout=60) for i in range(3)])
            await asyncio.wait_for(batched.wait(), 60)  # a batch gathered while the worker is taken
        finally:
            release.set()
        queued = await queued
        order.append("batched")
        return await lone, queued, batcher.idle
    lone, queued, idle_after = asyncio.run(_with(batcher, body))
    assert lone == {"b": [10]} and queued == [{"b": [2 * i]} for i in range(3)] and idle_after
    assert order[0].startswith("alone:irbis-predict") and order[-1] == "batched"
    assert [rows for _, rows in calls] == [1, 3]  # the lone call, then the three waiting as one batch


def test_a_lone_request_times_out_and_refuses_when_stopping():
    """The lone work holds the worker until the test releases it, after its timeout expired."""
    batcher = Batcher(lambda columns: columns)
    release = threading.Event()

    async def body():
        try:
            with pytest.raises(asyncio.TimeoutError):
                await batcher.run_alone(lambda: release.wait(60), timeout=0.05)
        finally:
            release.set()
        return await batcher.run_alone(lambda: "ok", timeout=30)
    assert asyncio.run(_with(batcher, body)) == "ok"
    assert not batcher.idle
    with pytest.raises(Exception, match="stopping"):
        asyncio.run(batcher.run_alone(lambda: "late"))


def _costed(monkeypatch, per_call: float, per_row: float):
    """A pipeline whose call costs ``per_call`` seconds plus ``per_row`` per row; records the batch sizes.

    The call sleeps that long, so that requests queue behind it as behind a real one, and the batcher's
    clock advances by exactly that cost: on a loaded machine a sleep's overshoot and the thread hand-off
    would add a cost per call of their own, and the batcher would rightly weigh it."""
    import irbis.serving.batcher as batcher_module

    sizes: list[int] = []
    clock = [0.0]
    monkeypatch.setattr(batcher_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def predict(columns):
        sizes.append(len(columns["a"]))
        cost = per_call + per_row * len(columns["a"])
        time.sleep(cost)
        clock[0] += cost
        return {"b": columns["a"]}
    return predict, sizes


async def _load(batcher: Batcher, requests: int, clients: int = 48) -> None:
    """``clients`` requests kept in flight until ``requests`` have been answered."""
    left = iter(range(requests))

    async def client():
        for i in left:
            assert await batcher.submit({"a": [i]}, 1, timeout=30) == {"b": [i]}
    await asyncio.gather(*[client() for _ in range(clients)])


def test_batches_stay_large_where_batching_pays(monkeypatch):
    """A call costs 8 ms whatever it holds (a fixed cost, as a tabular pipeline's or a GPU's): the batches
    grow to the largest size the queue fills."""
    predict, sizes = _costed(monkeypatch, 0.008, 0.00001)
    batcher = Batcher(predict, max_batch_size=32)
    asyncio.run(_with(batcher, lambda: _load(batcher, 600)))
    assert batcher.limit == 32 and max(sizes[-10:]) == 32


def test_batches_shrink_where_batching_gains_nothing(monkeypatch):
    """A call costs 2 ms per row and nothing more (a CNN on a few CPU cores): one large batch saves no
    time, so the batcher settles on small ones, and requests stop waiting behind long batches."""
    predict, sizes = _costed(monkeypatch, 0.0, 0.002)
    batcher = Batcher(predict, max_batch_size=32)
    asyncio.run(_with(batcher, lambda: _load(batcher, 1000)))
    assert batcher.limit <= 8, (batcher.limit, batcher._costs)
    assert max(sizes[:20]) >= 16  # it did try large batches first
    assert sorted(sizes[-40:])[20] <= 8  # and then ran small ones


def test_length_groups_answer_the_short_requests_of_a_drain_first():
    """With ``groups``, a drain runs as one call per group in the groups' order, each request answered
    with its own rows as soon as its group is done; a failing group falls back to its own requests."""
    calls: list[list[int]] = []
    done: list[int] = []

    def predict(columns):
        calls.append(list(columns["a"]))
        time.sleep(0.002 * sum(columns["a"]))  # a call costs what its values sum to
        if 13 in columns["a"]:
            raise ValueError("13 is bad")
        return {"b": [v * 2 for v in columns["a"]]}

    def groups(requests):  # short (under 10) first, then long
        short = [i for i, r in enumerate(requests) if r["a"][0] < 10]
        return [short, [i for i in range(len(requests)) if i not in short]]

    batcher = Batcher(predict, max_wait_ms=50, groups=groups)

    async def drain():  # the five requests queue before the batcher's loop wakes: one drain
        async def one(v):
            try:
                out = await batcher.submit({"a": [v]}, 1, timeout=5)
            except ValueError:
                out = "error"
            done.append(v)
            return out
        return await asyncio.gather(*[one(v) for v in (40, 2, 13, 3, 50)])

    answers = asyncio.run(_with(batcher, drain))
    assert answers == [{"b": [80]}, {"b": [4]}, "error", {"b": [6]}, {"b": [100]}]
    assert calls[:2] == [[2, 3], [40, 13, 50]]  # the short group, then the long one (which fails)
    assert sorted(calls[2:]) == [[13], [40], [50]]  # the long group's requests alone
    assert done.index(2) < done.index(40) and done.index(3) < done.index(50)
