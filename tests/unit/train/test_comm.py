"""ThreadCommunicator: the collectives every strategy relies on, and their byte counts."""

import threading

import pytest
import torch

from irbis.train.comm import ThreadCommunicator


def run(world, fn):
    comms = ThreadCommunicator.group(world, timeout=10)
    out = [None] * world
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, fn(comms[r]))) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, comms


def test_all_reduce_mean_and_bytes():
    def fn(c):
        t = torch.full((5,), float(c.rank))
        c.all_reduce_mean(t)
        return t

    out, comms = run(3, fn)
    for t in out:
        assert torch.equal(t, torch.full((5,), 1.0))
    assert all(c.bytes_sent == 20 for c in comms)


def test_all_gather_rank_order_and_broadcast():
    def fn(c):
        parts = c.all_gather(torch.tensor([c.rank * 10]))
        t = torch.tensor([float(c.rank + 1)])
        c.broadcast(t, src=1)
        return [int(p) for p in parts], float(t)

    out, _ = run(3, fn)
    assert all(o == ([0, 10, 20], 2.0) for o in out)


def test_gather_first_uses_first_arrivals_and_late_worker_gets_same():
    gate = threading.Event()

    def fn(c):
        if c.rank == 2:
            gate.wait(5)  # the straggler arrives last
        got = c.gather_first(torch.tensor([float(c.rank)]), k=2, tag="s1")
        if c.rank != 2:
            gate.set()
        return sorted(float(g) for g in got), c.bytes_sent

    out, _ = run(3, fn)
    assert all(o[0] == [0.0, 1.0] for o in out)
    assert out[2][1] == 0  # the late worker uploaded nothing


def test_group_rejects_bad_world_size():
    with pytest.raises(ValueError, match="world_size"):
        ThreadCommunicator.group(0)
