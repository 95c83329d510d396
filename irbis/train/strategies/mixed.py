"""The mixed mode: gradients averaged synchronously inside a group, applied asynchronously across groups.

Campos, Sastre, Yagües, Bellver, Giró-i-Nieto, Torres, "Distributed training
strategies for a computer vision deep learning algorithm on a distributed GPU
cluster", ICCS 2017 (the mixed mode, Section 5).

The ``N`` workers form ``N / G`` groups of ``G`` consecutive ranks (e.g. the
tasks of one executor). At each push the shards wait for every member of a
group and apply the group's mean gradient once,

.. math:: W \\leftarrow W - η\\, \\mathrm{rule}\\Big(\\frac{1}{G} \\sum_{i \\in \\mathcal G} g_i\\Big),

so each update uses a ``G`` times larger batch, while the groups never wait for
one another. The reduction happens at the shards (each member pushes to them and
gets the updated weights back), on the same wire as Downpour's pushes; with
``G = 1`` the mode is Downpour, with ``G = N`` it is synchronous SGD with a
parameter server.
"""

from __future__ import annotations

from typing import Any

from irbis.train.strategies.downpour import Downpour, _positive_int
from irbis.train.strategy import FlatParams, WorkerContext


class MixedSync(Downpour):
    """Synchronous inside groups of ``groupSize`` workers, asynchronous across groups.

    Parameters
    ----------
    groupSize : int, default 2
        Workers per group; must divide the number of workers.
    fetchEvery, pushEvery, serverOptimizer, numShards, placement
        As in :class:`~irbis.train.strategies.downpour.Downpour`.

    Examples
    --------
    >>> MixedSync(groupSize=4)
    MixedSync(fetchEvery=1, pushEvery=1, serverOptimizer='adagrad', numShards=0, placement='colocated', groupSize=4)
    """

    name = "mixed"

    def __init__(self, groupSize: int = 2, fetchEvery: int = 1, pushEvery: int = 1,
                 serverOptimizer: str = "adagrad", numShards: int = 0, placement: str = "colocated") -> None:
        if placement == "driver":
            raise ValueError("placement='driver' is for workers that never wait for each other; mixed's groups "
                             "reduce in lockstep: use 'colocated' or 'dedicated'")
        super().__init__(fetchEvery, pushEvery, serverOptimizer, numShards, placement)
        self.groupSize = _positive_int("groupSize", groupSize)

    def options(self) -> dict[str, Any]:
        return {**super().options(), "groupSize": self.groupSize}

    def check_workers(self, num_workers: int) -> None:
        if num_workers % self.groupSize:
            raise ValueError(f"groupSize={self.groupSize} does not divide numWorkers={num_workers}; "
                             "use a divisor of the number of workers")

    def setup(self, flat: FlatParams, ctx: WorkerContext) -> None:
        self.check_workers(ctx.world_size)
        super().setup(flat, ctx)

    def job_steps(self) -> int | None:
        """None: a group's members reduce together at every step, so every worker takes the same steps."""
        return None

    def shard_options(self, ctx: WorkerContext | None) -> dict[str, Any]:
        return {**super().shard_options(ctx), "group_size": self.groupSize}
