"""Sharded parameter servers, co-located with the training workers.

The flat weight buffer (:class:`~irbis.train.strategy.FlatParams`) is split into
``K`` contiguous shards balanced by size (:func:`~irbis.train.ps.rules.split_shards`);
shard ``k`` is served by worker ``k mod N`` from a thread of its training task
(co-located servers, the efficient choice on a homogeneous cluster; shards on extra barrier
tasks of their own, dedicated servers, are not offered yet). The pieces:

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

Faults. Training is one Spark barrier stage: when a task dies, Spark fails the stage and
re-runs every task, so the shards (threads of those tasks) restart too. With a
``checkpointDir`` nothing is lost: each checkpoint is a consistent cut (every worker has
finished the step's pushes before any saves), each worker saves the shards it hosts
(:meth:`ParameterServer.state_dict`: weights, server-optimizer state, versions, each
worker's last pull and sequence number, counters) beside its own weights, and on the retry
every shard is restored from it before any worker pushes again; the steps after the cut are
computed and applied once more, exactly once each. Without a checkpoint the retried stage
starts from the initial weights, as a fresh run. Either way every push a worker sent during
an epoch is counted in that epoch's record as applied, rejected or replayed.
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
        """Collective: every shard's counters since the last call, summed over the workers.

        ``[applied, rejected, replayed, *staleness histogram, pushed]``, where ``pushed`` counts the
        pushes the workers sent (one per shard), so that ``pushed`` is the sum of the three counters
        (times the group size for the applied ones) once every worker has finished its pushes.
        """
        now = self.client.stats(self.hosted)
        if now.size == 0:
            now = np.zeros(3 + STALENESS_BINS, dtype=np.int64)
        sent = self.client.seq * len(self.client.ranges)
        total = torch.from_numpy(np.append(now, sent).astype(np.float64))
        comm.all_reduce_sum(total)
        cum = total.numpy().astype(np.int64)
        delta = cum - (self.last_stats if self.last_stats is not None else 0)
        self.last_stats = cum
        return delta

    def shard_states(self) -> dict[int, ShardState]:
        """The shards this worker hosts, by shard index."""
        if self.servers:
            return {i: self.servers[0].shards[i] for i in self.hosted}
        return {i: self.client.hub.shards[i] for i in self.hosted}

    def state_dict(self) -> dict[str, Any]:
        """The hosted shards, this worker's sequence number and versions, the counters last reported.

        Call it at a consistent cut (after a barrier that every worker reaches once its pushes are done).
        """
        return {"shards": {i: s.state_dict() for i, s in self.shard_states().items()},
                "seq": self.client.seq, "versions": list(self.client.versions),
                "lastStats": None if self.last_stats is None else torch.from_numpy(self.last_stats.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s hosted shards and client position (before any worker pushes)."""
        shards = self.shard_states()
        if sorted(shards) != sorted(int(i) for i in state["shards"]):
            raise ValueError(f"the checkpoint holds shards {sorted(state['shards'])}, this worker hosts "
                             f"{sorted(shards)}; resume with the same numWorkers and numShards")
        for i, s in state["shards"].items():
            shards[int(i)].load_state_dict(s)
        self.client.seq, self.client.versions = int(state["seq"]), [int(v) for v in state["versions"]]
        last = state["lastStats"]
        self.last_stats = None if last is None else last.numpy().copy()

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
                                            ranges, world, aborted=lambda: getattr(comm, "aborted", False)))
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
