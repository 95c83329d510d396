"""Synchronous SGD with optional backup workers.

Chen, Pan, Monga, Bengio, Jozefowicz, "Revisiting Distributed Synchronous SGD",
2016 (arXiv:1604.00981).

Every step each of the ``N`` workers computes a gradient ``g_i`` on its own
minibatch; all apply the same mean

.. math:: g = \\frac{1}{N} \\sum_{i=1}^{N} g_i

in one all-reduce of the flat gradient buffer (a large embedding table's
gradient goes as the rows some worker's batch touched, with the same result:
:func:`irbis.train.strategy.all_reduce_mean`). With ``b`` backup workers the
step goes on with the first ``N - b`` gradients to arrive,

.. math:: g = \\frac{1}{N-b} \\sum_{i \\in A_{N-b}} g_i ,

where :math:`A_k` are the first ``k`` arrivals. Arrival order comes from an
atomic counter in the rendezvous store; only the first ``N - b`` workers
upload, and a straggler that arrives later reads the same ``N - b`` gradients
and applies the same update, so the replicas stay identical while the fast
workers never wait for it. A worker that came late then checks, before
computing its next gradient, whether that step is already decided; if it is,
it takes the step without computing (its gradient would be dropped), so a
straggler catches up rather than falling further behind. The exchange goes
through the store (rank 0's host), not a ring all-reduce, so use backup
workers when stragglers cost more than that detour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from irbis.train.strategy import FlatParams, Strategy, WorkerContext, all_reduce_mean


@dataclass
class State:
    """Whether this worker's last gradient came too late to be used (backup workers only)."""

    late: bool = False


def mean_of(parts: list[torch.Tensor]) -> torch.Tensor:
    """Element-wise mean of equally shaped tensors, summed in list order."""
    out = parts[0].clone()
    for p in parts[1:]:
        out.add_(p)
    return out.div_(len(parts))


class SyncSGD(Strategy):
    """All-reduce (mean) of the gradients every step.

    Parameters
    ----------
    backupWorkers : int, default 0
        ``b``: each step uses the first ``N - b`` gradients to arrive.

    Examples
    --------
    >>> SyncSGD(backupWorkers=1)
    SyncSGD(backupWorkers=1)
    """

    name = "sync"

    def __init__(self, backupWorkers: int = 0) -> None:
        if not isinstance(backupWorkers, int) or isinstance(backupWorkers, bool) or backupWorkers < 0:
            raise ValueError(f"backupWorkers must be an int >= 0, found {backupWorkers!r}")
        self.backupWorkers = backupWorkers
        self.state = State()

    def options(self) -> dict[str, Any]:
        return {"backupWorkers": self.backupWorkers}

    def setup(self, flat: FlatParams, ctx: WorkerContext) -> None:
        if self.backupWorkers >= ctx.world_size and ctx.world_size > 1:
            raise ValueError(f"backupWorkers must be < numWorkers ({ctx.world_size}), "
                             f"found {self.backupWorkers}")

    def reduce_grads(self, flat: FlatParams, ctx: WorkerContext, step: int) -> None:
        if ctx.world_size == 1:
            return
        if self.backupWorkers == 0:
            all_reduce_mean(flat, ctx.comm)  # an embedding table's gradient travels as its rows
            return
        k = ctx.world_size - self.backupWorkers
        parts = ctx.comm.gather_first(flat.grads, k, tag=f"sync/{step}")
        self.state.late = ctx.comm.late
        flat.grads.copy_(mean_of(parts))

    def step_decided(self, ctx: WorkerContext, step: int) -> bool:
        """A worker whose last gradient came too late asks whether ``step``'s first ``N - b`` have arrived
        too: if so it takes the step without computing, and so catches up instead of lagging further."""
        if not (self.backupWorkers and self.state.late):
            return False
        return ctx.comm.arrivals(f"sync/{step}") >= ctx.world_size - self.backupWorkers
