"""The batcher alone, on asyncio: where a batch runs, a lone request's wait, timeouts and batching."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from irbis.serving.batcher import Batcher


def _recorder(delay: float = 0.0):
    calls: list[tuple[str, int]] = []

    def predict(columns):
        calls.append((threading.current_thread().name, len(columns["a"])))
        time.sleep(delay)
        return {"b": [v * 2 for v in columns["a"]]}
    return predict, calls


async def _with(batcher: Batcher, body):
    await batcher.start()
    try:
        return await body()
    finally:
        await batcher.stop()


def test_cheap_batches_run_on_the_loop_and_slow_ones_on_the_worker():
    cheap, cheap_calls = _recorder()
    slow, slow_calls = _recorder(delay=0.01)

    async def ten(batcher):
        return [await batcher.submit({"a": [i]}, 1, timeout=5) for i in range(10)]

    for predict in (cheap, slow):
        batcher = Batcher(predict)
        assert asyncio.run(_with(batcher, lambda: ten(batcher))) == [{"b": [2 * i]} for i in range(10)]
    loop_thread = threading.current_thread().name
    assert cheap_calls[0][0].startswith("irbis-predict")  # no cost known yet: the worker
    assert cheap_calls[-1][0] == loop_thread  # then on the loop, once a call showed it cheap
    assert all(name.startswith("irbis-predict") for name, _ in slow_calls)


def test_a_lone_request_does_not_wait_for_company():
    predict, _ = _recorder(delay=0.005)
    batcher = Batcher(predict, max_wait_ms=2000)

    async def lone():
        start = time.perf_counter()
        await batcher.submit({"a": [1]}, 1, timeout=5)
        return time.perf_counter() - start
    assert asyncio.run(_with(batcher, lone)) < 1.0


def test_concurrent_requests_share_a_batch_and_get_their_own_rows():
    predict, calls = _recorder(delay=0.02)
    batcher = Batcher(predict, max_batch_size=64)

    async def many():
        return await asyncio.gather(*[batcher.submit({"a": [i, i]}, 2, timeout=5) for i in range(20)])
    answers = asyncio.run(_with(batcher, many))
    assert answers == [{"b": [2 * i, 2 * i]} for i in range(20)]
    assert max(rows for _, rows in calls) > 2 and len(calls) < 20


def test_timeout_expires_the_request_and_the_batcher_goes_on():
    predict, calls = _recorder(delay=0.3)
    batcher = Batcher(predict)

    async def late_then_fine():
        with pytest.raises(asyncio.TimeoutError):
            await batcher.submit({"a": [1]}, 1, timeout=0.05)
        return await batcher.submit({"a": [2]}, 1, timeout=5)
    assert asyncio.run(_with(batcher, late_then_fine)) == {"b": [4]}
