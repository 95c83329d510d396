"""ThreadCommunicator and StoreCommunicator: the collectives every strategy relies on, their byte counts, and
the store's replay for a worker that rejoins."""

import threading

import pytest
import torch

from irbis.train.comm import StoreCommunicator, ThreadCommunicator, connect_store, serve_store


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


def test_store_collectives_and_a_retried_rank_replays_them_with_the_original_results():
    # three ranks through one TCPStore; rank 1 then "dies" and a new attempt of it starts over: it
    # contributes other values, yet every completed collective gives it the results its peers got,
    # and the first collective its peers still wait for takes its new contribution
    import torch.distributed as dist

    store = serve_store("127.0.0.1", 3, 10.0)

    def comm(rank):  # one client connection per rank, as each worker process has
        return StoreCommunicator(dist.PrefixStore("job", connect_store("127.0.0.1", store.port, rank, 3, 10.0)),
                                 rank, 3)

    def first_attempt(c, value):
        t = torch.full((2,), value)
        c.all_reduce_sum(t)
        parts = c.all_gather(torch.tensor([int(value)]))
        b = torch.tensor([value])
        c.broadcast(b, src=2)
        c.barrier()
        return t.tolist(), [int(p) for p in parts], float(b)

    comms = [comm(r) for r in range(3)]
    out = [None] * 3
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, first_attempt(comms[r], float(r + 1))))
               for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out[0] == out[1] == out[2] == ([6.0, 6.0], [1, 2, 3], 3.0)
    assert comms[0].bytes_sent == 8 + 8  # the sum's and the gather's payloads

    retried = comm(1)
    assert first_attempt(retried, 50.0) == out[1]  # replayed: the stored contributions, not 50
    nxt = [None] * 3
    peers = [threading.Thread(target=lambda c=c, i=i: nxt.__setitem__(i, c.all_gather(torch.tensor([i * 7]))))
             for i, c in [(0, comms[0]), (2, comms[2])]]
    for t in peers:
        t.start()
    nxt[1] = retried.all_gather(torch.tensor([99]))  # the live collective: the new attempt's value counts
    for t in peers:
        t.join()
    assert all([int(p) for p in parts] == [0, 99, 14] for parts in nxt)
