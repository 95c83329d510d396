"""Sharded parameter servers, co-located with the training workers.

The flat weight buffer (:class:`~irbis.train.strategy.FlatParams`) is split into
``K`` contiguous shards balanced by size (:func:`~irbis.train.ps.rules.split_shards`);
shard ``k`` is served by worker ``k mod N`` from a thread of its training task
(co-located servers, the efficient choice on a homogeneous cluster). The pieces:

* :mod:`~irbis.train.ps.rules`: the server update rules (SGD, momentum, Adagrad) and
  DC-ASGD's delay compensation, pure numpy;
* :mod:`~irbis.train.ps.shard`: one shard's state (weights, optimizer state, version,
  last pulls, staleness histogram, counters);
* :mod:`~irbis.train.ps.transport`: ZeroMQ server and client (processes, Spark tasks);
* :mod:`~irbis.train.ps.local`: the in-process hub used when the workers are threads.

:func:`start` is what a strategy calls in its ``setup``: collectively, every worker
builds its shards from the (already broadcast) starting weights, rank 0's random
secret reaches every worker through the job's rendezvous, the servers bind to the
addresses the workers were given, every worker checks that every shard answers, and
a barrier ends the setup.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from irbis.train.ps.local import LocalClient, LocalHub
from irbis.train.ps.rules import split_shards
from irbis.train.ps.shard import STALENESS_BINS, ShardState

SECRET_BYTES = 32
ADDRESS_BYTES = 128


def _share_secret(comm: Any) -> bytes:
    key = torch.zeros(SECRET_BYTES, dtype=torch.uint8)
    if comm.rank == 0:
        key.copy_(torch.frombuffer(bytearray(secrets.token_bytes(SECRET_BYTES)), dtype=torch.uint8))
    comm.broadcast(key, src=0)
    return bytes(key.tolist())


def _gather_text(comm: Any, text: str) -> list[str]:
    raw = text.encode()
    if len(raw) > ADDRESS_BYTES:
        raise ValueError(f"address {text!r} is longer than {ADDRESS_BYTES} bytes")
    buf = torch.zeros(ADDRESS_BYTES, dtype=torch.uint8)
    buf[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    return [bytes(t.tolist()).rstrip(b"\0").decode() for t in comm.all_gather(buf)]


@dataclass
class ParameterServer:
    """A worker's handle on the sharded server: its client, the servers it hosts, its shard ids."""

    client: Any
    hosted: list[int]
    servers: list[Any] = field(default_factory=list)
    last_stats: np.ndarray | None = None

    def stats_delta(self, comm: Any) -> np.ndarray:
        """Collective: every shard's counters since the last call, summed over the workers."""
        now = self.client.stats(self.hosted)
        if now.size == 0:
            now = np.zeros(3 + STALENESS_BINS, dtype=np.int64)
        total = torch.from_numpy(now.astype(np.float64))
        comm.all_reduce_sum(total)
        cum = total.numpy().astype(np.int64)
        delta = cum - (self.last_stats if self.last_stats is not None else 0)
        self.last_stats = cum
        return delta

    def close(self) -> None:
        self.client.close()
        for server in self.servers:
            server.close()


def start(weights: np.ndarray, sizes: list[int], ctx: Any, num_shards: int, **shard_options: Any) -> ParameterServer:
    """Collective: start the co-located shards and connect this worker to all of them.

    ``weights`` is this worker's flat weight buffer as float32 numpy (identical on every worker);
    ``num_shards`` 0 means one shard per worker (capped at the number of weights).
    """
    comm, world, rank = ctx.comm, ctx.world_size, ctx.rank
    k = num_shards or min(world, int(sum(sizes)))
    ranges = split_shards(sizes, k)
    hosted = [i for i in range(k) if i % world == rank]
    shared = getattr(comm, "shared_object", None)
    if shared is not None:  # worker threads of one process
        hub = shared("ps", lambda: LocalHub([ShardState(weights[lo:hi], **shard_options) for lo, hi in ranges],
                                            ranges, world))
        ps = ParameterServer(LocalClient(hub, rank), hosted)
    else:
        from irbis.train.ps.transport import PSClient, ShardServer  # zmq only where workers are processes

        secret = _share_secret(comm)
        server = ShardServer({i: ShardState(weights[ranges[i][0]:ranges[i][1]], **shard_options) for i in hosted},
                             secret, getattr(ctx, "host", "127.0.0.1"))
        addresses = _gather_text(comm, server.address)
        client = PSClient([addresses[i % world] for i in range(k)], ranges, secret, rank)
        ps = ParameterServer(client, hosted, [server])
        error: Exception | None = None
        try:
            client.hello()
        except (ValueError, PermissionError) as err:
            error = err
        failed = torch.tensor([float(error is not None)])
        comm.all_reduce_sum(failed)  # every worker learns of a failure, none waits for a peer that gave up
        if failed.item():
            ps.close()
            raise error or ValueError(f"{int(failed.item())} worker(s) could not reach the parameter server")
    comm.barrier()
    return ps


__all__ = ["ParameterServer", "start"]
