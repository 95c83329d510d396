"""Sharded parameter servers, co-located with the training workers or on dedicated tasks.

The flat weight buffer (:class:`~irbis.train.strategy.FlatParams`) is split into
``K`` contiguous shards balanced by size (:func:`~irbis.train.ps.rules.split_shards`).
Where they run is the strategies' ``placement`` (a :class:`Layout`):

* ``colocated`` (default): shard ``k`` is served by worker ``k mod N`` from a thread of its
  training task, the efficient choice on a homogeneous cluster;
* ``dedicated``: the barrier stage gets ``K`` extra tasks with empty partitions, rank ``N + k``
  serving shard ``k`` and training nothing (:mod:`~irbis.train.ps.dedicated`); the workers'
  own collectives run in a subgroup of the workers (:mod:`irbis.train.roles`).

The pieces:

* :mod:`~irbis.train.ps.rules`: the server update rules (SGD, momentum, Adagrad, RMSProp, your own) and
  DC-ASGD's delay compensation, pure numpy;
* :mod:`~irbis.train.ps.shard`: one shard's state (weights, optimizer state, version,
  last pulls, staleness histogram, counters);
* :mod:`~irbis.train.ps.transport`: ZeroMQ server and client (processes, Spark tasks);
* :mod:`~irbis.train.ps.in_process`: the in-process hub used when the workers are threads;
* :mod:`~irbis.train.ps.dedicated`: a dedicated server's body (serve, save at each cut, stop);
* :mod:`~irbis.train.ps.driver`: the shards of ``placement="driver"``, served by the driver
  process, under which the workers are ordinary tasks and one that dies is retried alone.

:func:`start` is what a strategy calls in its ``setup``, and :func:`connect` what it and a
dedicated server run: collectively over every rank that hosts or reaches a shard, each builds its
shards from the (already broadcast) starting weights, rank 0's random secret reaches every rank
through the job's rendezvous, the servers bind to the addresses the workers were given, every
worker checks that every shard answers, and a barrier ends the setup.

Faults. Under the co-located and dedicated placements training is one Spark barrier stage (under
``placement="driver"`` it is not, see :mod:`~irbis.train.ps.driver`): when a task dies, Spark fails the stage and
re-runs every task, so the shards (threads or tasks of that stage) restart too. With a
``checkpointDir`` nothing is lost: each checkpoint is a consistent cut (every worker has
finished the step's pushes before any saves), each worker, or dedicated server, saves the shards it hosts
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

from irbis.train.ps.in_process import LocalClient, LocalHub
from irbis.train.ps.rules import default_shards, split_shards
from irbis.train.ps.shard import SECRET_BYTES, STALENESS_BINS, ShardState

DONE = 2  # see irbis.train.ps.dedicated
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
    """A rank's handle on the sharded server: its client (None on a dedicated server), the shards it hosts,
    the shards whose counters it reports, and the dedicated servers' shards (rank 0 sends them CUT/DONE)."""

    client: Any
    hosted: list[int]
    servers: list[Any] = field(default_factory=list)
    last_stats: np.ndarray | None = None
    counted: list[int] | None = None
    dedicated: list[int] = field(default_factory=list)
    hub: Any = None

    def stats_delta(self, comm: Any) -> np.ndarray:
        """Collective: every shard's counters since the last call, summed over the workers.

        ``[applied, rejected, replayed, *staleness histogram, pushed]``, where ``pushed`` counts the
        pushes the workers sent (one per shard), so that ``pushed`` is the sum of the three counters
        (times the group size for the applied ones) once every worker has finished its pushes.
        """
        now = self.client.stats(self.hosted if self.counted is None else self.counted)
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
        """The shards this rank hosts, by shard index."""
        if self.servers:
            return {i: self.servers[0].shards[i] for i in self.hosted}
        hub = self.hub if self.client is None else self.client.hub
        return {i: hub.shards[i] for i in self.hosted}

    def control(self, command: int, step: int = 0) -> None:
        """Rank 0 (after a barrier of the workers): send ``command`` to every dedicated server; else nothing."""
        if self.dedicated and self.client is not None and self.client.worker == 0:
            shards = self.dedicated
            if command == DONE:
                self.dedicated = []  # sent once
            self.client.control(command, step, shards)

    def state_dict(self) -> dict[str, Any]:
        """The hosted shards, this worker's sequence number and versions, the counters last reported.

        Call it at a consistent cut (after a barrier that every worker reaches once its pushes are done).
        """
        client = self.client
        return {"shards": {i: s.state_dict() for i, s in self.shard_states().items()},
                "seq": client.seq if client else 0, "versions": list(client.versions) if client else [],
                "lastStats": None if self.last_stats is None else torch.from_numpy(self.last_stats.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s hosted shards and client position (before any worker pushes)."""
        shards = self.shard_states()
        if sorted(shards) != sorted(int(i) for i in state["shards"]):
            raise ValueError(f"the checkpoint holds shards {sorted(state['shards'])}, this rank hosts "
                             f"{sorted(shards)}; resume with the same numWorkers, numShards and placement")
        for i, s in state["shards"].items():
            shards[int(i)].load_state_dict(s)
        if self.client is not None:
            self.client.seq, self.client.versions = int(state["seq"]), [int(v) for v in state["versions"]]
        last = state["lastStats"]
        self.last_stats = None if last is None else last.numpy().copy()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for server in self.servers:
            server.close()


@dataclass
class Layout:
    """Who hosts which shard: ``num_workers`` workers (ranks ``0..N-1`` of ``comm``), then, when
    ``dedicated``, one server rank per shard (rank ``N + i`` hosts shard ``i``); else shard ``i`` lives
    on worker ``i mod N``."""

    comm: Any
    num_workers: int
    num_shards: int
    dedicated: bool = False

    def host_of(self, shard: int) -> int:
        return self.num_workers + shard if self.dedicated else shard % self.num_workers

    def hosted(self, rank: int) -> list[int]:
        return [i for i in range(self.num_shards) if self.host_of(i) == rank]


def start(weights: np.ndarray, sizes: list[int], ctx: Any, num_shards: int, **shard_options: Any) -> ParameterServer:
    """Collective: start the shards (co-located, or on the dedicated servers) and connect this worker to them.

    ``weights`` is this worker's flat weight buffer as float32 numpy (identical on every worker);
    ``num_shards`` 0 means one shard per worker, none smaller than
    :data:`~irbis.train.ps.rules.MIN_SHARD_WEIGHTS` when co-located. With dedicated servers
    (``ctx.servers`` set) the servers run :func:`irbis.train.ps.dedicated.serve` at the same time.
    With the driver's shards (``ctx.endpoint`` set) it is not collective: the worker joins them and
    pulls their current weights into ``weights`` (see :mod:`~irbis.train.ps.driver`).
    """
    if ctx.endpoint is not None:
        from irbis.train.ps.driver import join

        client = join(ctx.endpoint, weights, sizes, ctx.rank)
        counted = [i for i in range(len(client.ranges)) if i % ctx.world_size == ctx.rank]
        return ParameterServer(client, [], counted=counted)
    if ctx.servers is None:
        layout = Layout(ctx.comm, ctx.world_size, num_shards or default_shards(int(sum(sizes)), ctx.world_size))
    else:
        layout = Layout(ctx.servers, ctx.world_size, num_shards or ctx.world_size, dedicated=True)
        ctx.servers.broadcast(torch.from_numpy(weights), src=0)  # the servers' starting weights
    return connect(layout, ctx.rank, weights, sizes, getattr(ctx, "host", "127.0.0.1"), shard_options)


def connect(layout: Layout, rank: int, weights: np.ndarray, sizes: list[int], host: str,
            shard_options: dict[str, Any], on_control: Any = None,
            restore: dict[str, Any] | None = None) -> ParameterServer:
    """Collective over ``layout.comm``: build this rank's shards, start their server, connect the workers.

    A dedicated server passes ``on_control`` (its CUT/DONE handler) and, when resuming, ``restore`` (its
    saved :meth:`ParameterServer.state_dict`), applied before the closing barrier lets any worker push.
    """
    comm, k = layout.comm, layout.num_shards
    ranges = split_shards(sizes, k)
    hosted, is_worker = layout.hosted(rank), rank < layout.num_workers
    counted = [i for i in range(k) if i % layout.num_workers == rank] if layout.dedicated else None
    dedicated = list(range(k)) if layout.dedicated else []
    shared = getattr(comm, "shared_object", None)
    if shared is not None:  # ranks are threads of one process
        hub = shared("ps", lambda: LocalHub([ShardState(weights[lo:hi], **shard_options) for lo, hi in ranges],
                                            ranges, layout.num_workers,
                                            aborted=lambda: getattr(comm, "aborted", False)))
        for i in hosted if on_control else []:
            hub.on_control[i] = on_control
        ps = ParameterServer(LocalClient(hub, rank) if is_worker else None, hosted, counted=counted,
                             dedicated=dedicated, hub=hub)
    else:
        ps = _connect_remote(layout, rank, weights, ranges, hosted, host, shard_options, on_control)
        ps.counted, ps.dedicated = counted, dedicated
    if restore is not None:
        ps.load_state_dict(restore)
    comm.barrier()
    return ps


def _connect_remote(layout: Layout, rank: int, weights: np.ndarray, ranges: list[tuple[int, int]],
                    hosted: list[int], host: str, shard_options: dict[str, Any], on_control: Any) -> ParameterServer:
    from irbis.train.ps.transport import PSClient, ShardServer  # zmq only where ranks are processes

    comm = layout.comm
    secret = _share_secret(comm)
    server = ShardServer({i: ShardState(weights[ranges[i][0]:ranges[i][1]], **shard_options) for i in hosted},
                         secret, host, on_control) if hosted else None
    addresses = _gather_text(comm, server.address if server else "")
    client = None
    if rank < layout.num_workers:
        client = PSClient([addresses[layout.host_of(i)] for i in range(len(ranges))], ranges, secret, rank)
    ps = ParameterServer(client, hosted, [server] if server else [])
    error: Exception | None = None
    try:
        if client is not None:
            client.hello()
    except (ValueError, PermissionError) as err:
        error = err
    failed = torch.tensor([float(error is not None)])
    comm.all_reduce_sum(failed)  # every rank learns of a failure, none waits for a peer that gave up
    if failed.item():
        ps.close()
        raise error or ValueError(f"{int(failed.item())} worker(s) could not reach the parameter server")
    return ps


__all__ = ["Layout", "ParameterServer", "connect", "start"]
