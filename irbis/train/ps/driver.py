"""Shards served by the driver: the placement under which a worker that dies is retried alone.

With ``placement="driver"`` the shards live in the process that submits the job, which outlives
every task, instead of inside the training tasks. The workers then need no barrier stage: they run
as ordinary Spark tasks, their few collectives go through the rendezvous store
(:class:`~irbis.train.comm.StoreCommunicator`), and when one dies Spark retries that task alone.
The retried worker connects again, continues its sequence numbers after the last push a shard
applied from it (:meth:`~irbis.train.ps.transport.PSClient.hello`), pulls the shards' *current*
weights and replays the epochs its peers finished without taking their steps again; the others
never stop. Nothing is lost: every push sent before the death was applied or never arrived, and
each epoch's record counts pushes against updates as under the other placements.

The price is the driver's network link and cores: every push and pull crosses them, as with the
single parameter server of sparktorch or elephas, so this placement suits networks of modest size
or clusters whose workers are unreliable. It needs a classic session (the executors must reach the
driver, as they already do for the rendezvous store); a Spark Connect client may be unreachable.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from irbis.train.ps.rules import default_shards, split_shards
from irbis.train.ps.shard import SECRET_BYTES, ShardState


class DriverServers:
    """The job's shards, one ZeroMQ server thread each, in this (the driver's) process.

    Parameters
    ----------
    weights : numpy.ndarray
        The starting flat weight buffer (float32), what every worker first pulls.
    sizes : list of int
        The trainable parameters' sizes, in buffer order (the shard split follows them).
    num_workers : int
    num_shards : int
        0: one per worker, none smaller than :data:`~irbis.train.ps.rules.MIN_SHARD_WEIGHTS`.
    shard_options : dict
        What every :class:`~irbis.train.ps.shard.ShardState` is built with (the strategy's).
    host : str
        The driver's address as the executors reach it (``spark.driver.host``).
    """

    def __init__(self, weights: np.ndarray, sizes: list[int], num_workers: int, num_shards: int,
                 shard_options: dict[str, Any], host: str = "127.0.0.1") -> None:
        from irbis.train.ps.transport import ShardServer

        self.ranges = split_shards(sizes, num_shards or default_shards(int(sum(sizes)), num_workers))
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self.servers = [ShardServer({i: ShardState(weights[lo:hi], **shard_options)}, self.secret, host)
                        for i, (lo, hi) in enumerate(self.ranges)]

    @classmethod
    def for_job(cls, network: dict[str, Any], seed: int, strategy: Any, num_workers: int,
                host: str = "127.0.0.1") -> DriverServers:
        """The shards of a job that trains ``network`` (a :func:`~irbis.train.networks.network_spec`), started
        from the weights every worker would draw with ``seed``."""
        from irbis.train.networks import build_network

        with torch.random.fork_rng(devices=[]):  # the driver's own random stream is left as it was
            torch.manual_seed(seed)
            net = build_network(network)
        params = [p.detach().reshape(-1) for p in net.parameters() if p.requires_grad]
        weights = torch.cat(params).to(torch.float32).numpy()
        return cls(weights, [p.numel() for p in params], num_workers, strategy.numShards,
                   strategy.shard_options(None), host)

    def endpoint(self) -> dict[str, Any]:
        """What a worker needs to join: each shard's address and the job's secret (plain values)."""
        return {"addresses": [s.address for s in self.servers], "secret": self.secret.hex()}

    def weights(self) -> np.ndarray:
        """The shards' current weights as one flat buffer."""
        return np.concatenate([next(iter(s.shards.values())).weights for s in self.servers])

    def shards(self) -> list[ShardState]:
        """The shards, by index."""
        return [next(iter(s.shards.values())) for s in self.servers]

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> DriverServers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def join(endpoint: dict[str, Any], weights: np.ndarray, sizes: list[int], rank: int) -> Any:
    """A worker's client of the driver's shards, with the shards' current weights pulled into ``weights``.

    Not collective: a worker retried after it died calls it alone. ValueError names a shard that does
    not answer, PermissionError a wrong secret.
    """
    from irbis.train.ps.transport import PSClient

    addresses = list(endpoint["addresses"])
    client = PSClient(addresses, split_shards(sizes, len(addresses)), bytes.fromhex(endpoint["secret"]), rank)
    try:
        client.hello()
        client.pull(weights)
    except BaseException:
        client.close()
        raise
    return client


@contextmanager
def served(spec: Any, strategy: Any, num_workers: int, host: str = "127.0.0.1") -> Iterator[Any]:
    """``spec`` (a :class:`~irbis.train.loop.TrainSpec`) joined to fresh driver shards while the block
    runs, when ``strategy`` (the one ``spec`` names, as the caller built it) places the shards on the
    driver (:meth:`~irbis.train.strategy.Strategy.elastic`); else ``spec`` as it is. The shards stop when
    the block ends."""
    if not strategy.elastic():
        yield spec
        return
    if spec.checkpoint.checkpointDir:
        raise ValueError(f"{spec.parallel.strategy} with placement='driver' keeps its shards in the driver, which "
                         "outlives every task (a retried worker rejoins from their current weights); checkpointDir "
                         "is for shards inside the tasks: unset it, or use placement 'colocated' or 'dedicated'")
    with DriverServers.for_job(spec.network, spec.data.seed, strategy, num_workers, host) as servers:
        yield spec.updated(ps_endpoint=servers.endpoint())


__all__ = ["DriverServers", "join", "served"]
