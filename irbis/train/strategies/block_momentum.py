"""Block momentum: blockwise model-update filtering (BMUF).

K. Chen, Q. Huo, "Scalable training of deep learning machines by incremental
block training with intra-block parallel optimization and blockwise
model-update filtering", ICASSP 2016 (CNTK's ``block_momentum_distributed_learner``).

Every block of ``τ`` local steps, starting from the model handed out,
:math:`W_{init}(t)`, the workers' models are averaged into :math:`\\bar W(t)`, and

.. math::
    G(t)      &= \\bar W(t) - W_{init}(t)                         \\\\
    \\Delta(t) &= \\eta \\, \\Delta(t-1) + \\zeta \\, G(t)           \\\\
    W(t)      &= W(t-1) + \\Delta(t)

with block momentum :math:`\\eta` and block learning rate :math:`\\zeta`. The next
block starts from :math:`W_{init}(t+1) = W(t)` (classical block momentum) or
:math:`W(t) + \\eta \\, \\Delta(t)` (Nesterov). :math:`\\eta = 0, \\zeta = 1` is
model averaging. Chen & Huo recommend :math:`\\zeta = 1, \\eta = 1 - 1/N`, the
default here. The final model is :math:`W` after a last (possibly partial) block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from irbis.train.strategy import FlatParams, Strategy, WorkerContext


@dataclass
class State:
    """Global model ``W``, filtered update ``Δ``, the model handed out, local steps in the block."""

    global_weights: torch.Tensor | None = None
    delta: torch.Tensor | None = None
    init_weights: torch.Tensor | None = None
    since_sync: int = 0


def bmuf_update(avg: torch.Tensor, state: State, eta: float, zeta: float, nesterov: bool) -> torch.Tensor:
    """Apply one BMUF update in place on ``state``; return the next model to hand out."""
    assert state.init_weights is not None and state.delta is not None and state.global_weights is not None
    g = avg - state.init_weights
    delta = state.delta.mul_(eta).add_(g, alpha=zeta)
    weights = state.global_weights.add_(delta)
    start = weights + eta * delta if nesterov else weights.clone()
    state.init_weights = start
    return start


class BlockMomentum(Strategy):
    """BMUF: local steps, then a momentum-filtered update of a global model.

    Parameters
    ----------
    blockSize : int, default 8
        ``τ``, local steps (minibatches) per block on every worker.
    blockLearningRate : float, default 1.0
        ``ζ``.
    blockMomentum : float, optional
        ``η`` in ``[0, 1)``; default ``1 - 1/N`` for ``N`` workers.
    nesterov : bool, default False
        Hand out ``W + η·Δ`` instead of ``W``.

    Examples
    --------
    >>> BlockMomentum(blockSize=4, blockMomentum=0.5)
    BlockMomentum(blockSize=4, blockLearningRate=1.0, blockMomentum=0.5, nesterov=False)
    """

    name = "block_momentum"
    averages_models = True

    def __init__(self, blockSize: int = 8, blockLearningRate: float = 1.0,
                 blockMomentum: float | None = None, nesterov: bool = False) -> None:
        if not isinstance(blockSize, int) or isinstance(blockSize, bool) or blockSize < 1:
            raise ValueError(f"blockSize must be an int >= 1, found {blockSize!r}")
        if not isinstance(blockLearningRate, (int, float)) or blockLearningRate <= 0:
            raise ValueError(f"blockLearningRate must be > 0, found {blockLearningRate!r}")
        if blockMomentum is not None and not (isinstance(blockMomentum, (int, float))
                                              and 0 <= blockMomentum < 1):
            raise ValueError(f"blockMomentum must be in [0, 1), found {blockMomentum!r}")
        if not isinstance(nesterov, bool):
            raise TypeError(f"nesterov must be a bool, found {nesterov!r}")
        self.blockSize = blockSize
        self.blockLearningRate = float(blockLearningRate)
        self.blockMomentum = None if blockMomentum is None else float(blockMomentum)
        self.nesterov = nesterov
        self.state = State()

    def options(self) -> dict[str, Any]:
        return {"blockSize": self.blockSize, "blockLearningRate": self.blockLearningRate,
                "blockMomentum": self.blockMomentum, "nesterov": self.nesterov}

    def eta(self, world_size: int) -> float:
        """The block momentum in use: the option, or ``1 - 1/N``."""
        return self.blockMomentum if self.blockMomentum is not None else 1.0 - 1.0 / world_size

    def setup(self, flat: FlatParams, ctx: WorkerContext) -> None:
        s = self.state
        if s.global_weights is None:
            s.global_weights = flat.weights.detach().clone()
            s.delta = torch.zeros_like(flat.weights)
            s.init_weights = flat.weights.detach().clone()

    def after_step(self, flat: FlatParams, ctx: WorkerContext, step: int) -> None:
        self.state.since_sync += 1
        if self.state.since_sync >= self.blockSize:
            self._block_update(flat, ctx)

    def finalize(self, flat: FlatParams, ctx: WorkerContext) -> None:
        if self.state.since_sync > 0:
            self._block_update(flat, ctx)
        assert self.state.global_weights is not None  # set up by setup()
        flat.weights.copy_(self.state.global_weights)

    def _block_update(self, flat: FlatParams, ctx: WorkerContext) -> None:
        avg = flat.weights.detach().clone()
        ctx.comm.all_reduce_mean(avg)
        start = bmuf_update(avg, self.state, self.eta(ctx.world_size), self.blockLearningRate, self.nesterov)
        flat.weights.copy_(start)
        self.state.since_sync = 0

    def state_dict(self) -> dict[str, Any]:
        s = self.state
        return {"global_weights": s.global_weights, "delta": s.delta, "init_weights": s.init_weights,
                "since_sync": s.since_sync}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = State(state["global_weights"].clone(), state["delta"].clone(),
                           state["init_weights"].clone(), int(state["since_sync"]))
