"""Ranks and roles: which ranks of a job train and which serve parameter-server shards.

A strategy with dedicated servers (:meth:`~irbis.train.strategy.Strategy.server_tasks` > 0) runs
``N + K`` ranks: ranks ``0..N-1`` are workers, whose collectives run in a subgroup of their own
(``comm.subgroup``), and ranks ``N..N+K-1`` run :func:`irbis.train.ps.dedicated.serve`. Every
backend calls :func:`run_rank`, so the thread backend and Spark split the ranks the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from irbis.train.loop import Report, TrainSpec, WorkerResult, train_worker
from irbis.train.networks import build_network
from irbis.train.strategies import make_strategy
from irbis.train.strategy import WorkerContext
from irbis.train.worker_data import Shard


def run_rank(spec: TrainSpec, num_workers: int, shard: Shard | None, comm: Any, rank: int, device: str = "cpu",
             host: str = "127.0.0.1", report: Report | None = None,
             model: torch.nn.Module | None = None) -> WorkerResult:
    """Train (ranks below ``num_workers``) or serve a shard (the others); ``comm`` spans every rank."""
    if comm.world_size == num_workers:
        ctx = WorkerContext(comm, rank, num_workers, device, host, endpoint=spec.parallel.ps_endpoint)
        return train_worker(spec, shard, ctx, report, model)
    workers = comm.subgroup(list(range(num_workers)))
    if rank < num_workers:
        ctx = WorkerContext(workers, rank, num_workers, device, host, servers=comm)
        return train_worker(spec, shard, ctx, report, model)
    from irbis.train.ps.dedicated import serve

    strategy = make_strategy(spec.parallel.strategy, **spec.parallel.strategyOptions)
    net = model if model is not None else build_network(spec.network)
    sizes = [p.numel() for p in net.parameters() if p.requires_grad]
    options = strategy.shard_options(WorkerContext(comm, rank, num_workers, device, host))
    info = serve(comm, rank, num_workers, comm.world_size - num_workers, sizes, options,
                 spec.checkpoint.checkpointDir, host)
    return WorkerResult(rank, [], info=info)


__all__ = ["run_rank"]
