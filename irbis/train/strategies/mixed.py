"""The mixed mode: gradients averaged synchronously inside a group, applied asynchronously across groups.

Campos, Sastre, Yagües, Bellver, Giró-i-Nieto, Torres, "Distributed training
strategies for a computer vision deep learning algorithm on a distributed GPU
cluster", ICCS 2017 (the mixed mode, Sections 5 and 6).

The ``N`` workers form ``N / G`` groups of ``G`` consecutive ranks (e.g. the
tasks of one executor, as the paper's four GPUs of a node). At each push the
members average their gradients with an all-reduce inside the group, and the
group's leader (its first rank) alone pushes the mean to the parameter servers,
which apply it as one update,

.. math:: W \\leftarrow W - η\\, \\mathrm{rule}\\Big(\\frac{1}{G} \\sum_{i \\in \\mathcal G} g_i\\Big),

then pulls the weights and broadcasts them inside the group. Each update so uses
a ``G`` times larger batch while the groups never wait for one another, and the
parameter servers receive one gradient per group instead of one per worker: the
bytes pushed per step are Downpour's divided by ``G`` ("only a single collection
of gradients needs to be exchanged through the network for each set of four model
replicas", Section 5). With ``G = 1`` the mode is Downpour, with ``G = N``
synchronous SGD with a parameter server.
"""

from __future__ import annotations

from typing import Any

import torch

from irbis.train.comm import Communicator
from irbis.train.strategies.downpour import Downpour, _positive_int
from irbis.train.strategy import FlatParams, WorkerContext


class MixedSync(Downpour):
    """Synchronous inside groups of ``groupSize`` workers, asynchronous across groups.

    Parameters
    ----------
    groupSize : int, default 2
        Workers per group (consecutive ranks); must divide the number of workers.
    fetchEvery, pushEvery, serverOptimizer, numShards, placement, serverWeightDecay
        As in :class:`~irbis.train.strategies.downpour.Downpour`; the group averages its accumulated
        gradients at each push, and its leader fetches for the group.

    Examples
    --------
    >>> MixedSync(groupSize=4)  # doctest: +NORMALIZE_WHITESPACE
    MixedSync(fetchEvery=1, pushEvery=1, serverOptimizer='adagrad', numShards=0, placement='colocated',
              serverWeightDecay=0.0, groupSize=4)
    """

    name = "mixed"

    def __init__(self, groupSize: int = 2, fetchEvery: int = 1, pushEvery: int = 1,
                 serverOptimizer: str = "adagrad", numShards: int = 0, placement: str = "colocated",
                 serverWeightDecay: float = 0.0) -> None:
        if placement == "driver":
            raise ValueError("placement='driver' is for workers that never wait for each other; mixed's groups "
                             "reduce in lockstep: use 'colocated' or 'dedicated'")
        super().__init__(fetchEvery, pushEvery, serverOptimizer, numShards, placement, serverWeightDecay)
        self.groupSize = _positive_int("groupSize", groupSize)
        self.group: Communicator | None = None
        self.leader = True

    def options(self) -> dict[str, Any]:
        return {**super().options(), "groupSize": self.groupSize}

    def check_workers(self, num_workers: int) -> None:
        if num_workers % self.groupSize:
            raise ValueError(f"groupSize={self.groupSize} does not divide numWorkers={num_workers}; "
                             "use a divisor of the number of workers")

    def setup(self, flat: FlatParams, ctx: WorkerContext) -> None:
        """Collective: form the groups, start the shards; the members that are not a leader never reach them."""
        self.check_workers(ctx.world_size)
        first = ctx.rank - ctx.rank % self.groupSize
        self.leader = ctx.rank == first
        if self.groupSize == 1:
            self.group = None
        elif self.groupSize == ctx.world_size:
            self.group = ctx.comm
        else:
            comm: Any = ctx.comm  # the thread and torch.distributed communicators (not the elastic store's)
            self.group = comm.subgroup(list(range(first, first + self.groupSize)))
        super().setup(flat, ctx)
        if not self.leader:
            self.state.server.client.leave()

    def _in_group(self, collective: Any, tensor: torch.Tensor) -> None:
        """Run ``collective`` on the group's communicator; its bytes count in this worker's bytes per step."""
        group = self.group
        assert group is not None  # groupSize > 1
        before = group.bytes_sent
        collective(tensor)
        if group is not self.state.ctx.comm:
            self.state.ctx.comm.bytes_sent += group.bytes_sent - before

    def push(self, grads: torch.Tensor, lr: float, pull_into: torch.Tensor | None = None) -> None:
        """Collective in the group: average ``grads`` over it, the leader pushes the mean (and pulls), and the
        members get the leader's weights."""
        if self.group is None:
            super().push(grads, lr, pull_into)
            return
        self._in_group(self.group.all_reduce_mean, grads)
        if self.leader:
            super().push(grads, lr, pull_into)
        if pull_into is not None:
            self._in_group(self.group.broadcast, pull_into)

    def pull(self, weights: torch.Tensor) -> None:
        """Collective in the group: the leader pulls, the members get its weights."""
        if self.leader:
            super().pull(weights)
        if self.group is not None:
            self._in_group(self.group.broadcast, weights)

    def job_steps(self) -> int | None:
        """None: a group's members reduce together at every push, so every worker takes the same steps."""
        return None

    def close(self) -> None:
        super().close()
        self.group = None
