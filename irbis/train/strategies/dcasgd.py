"""DC-ASGD: asynchronous SGD with delay compensation at the parameter server.

Zheng, Meng, Wang, Chen, Yu, Ma, Liu, "Asynchronous Stochastic Gradient Descent
with Delay Compensation", ICML 2017.

Workers behave as in Downpour (:mod:`~irbis.train.strategies.downpour`). A
gradient ``g`` computed at the weights ``W_pulled`` worker ``i`` last fetched
reaches a shard that now holds ``W_now``; the shard corrects it with a cheap
diagonal approximation of the Hessian, ``g ⊙ g``, before its update rule:

.. math:: \\tilde g = g + λ\\, g \\odot g \\odot (W_{now} - W_{pulled}), \\qquad W \\leftarrow W - η \\tilde g

With ``adaptive`` (DC-ASGD-a), :math:`λ_t = λ_0 / \\sqrt{M_t + ε}` with the
running mean square :math:`M_t = m M_{t-1} + (1 - m)\\, g \\odot g`, m = 0.95. With
``lambda_ = 0`` it is Downpour exactly.

Compare it with Downpour on the same server rule: Downpour's default is Adagrad, this one's SGD,
and at one rate the two rules train to different points. On the digits MLP (batch 16, 10 epochs,
4 workers, mean staleness 3) DC-ASGD at SGD 0.05 tested 1.7-3.3 points below Downpour at its
Adagrad default on each of 4 seeds, and within the run-to-run spread of Downpour at SGD 0.05
(λ = 0); under plain SGD the compensation was under 1.1% of the gradient's norm, and λ0 = 0.5 or
a bias-corrected mean square changed nothing beyond that spread (``benchmarks/dcasgd_defaults.py``),
so the defaults stay.
"""

from __future__ import annotations

from typing import Any

from irbis.train.strategies.downpour import Downpour
from irbis.train.strategy import WorkerContext


class DCASGD(Downpour):
    """Downpour with delay-compensated server updates (DC-ASGD, DC-ASGD-a).

    Parameters
    ----------
    lambda_ : float, default 2.0
        Compensation strength ``λ_0`` (>= 0; 0 is Downpour).
    adaptive : bool, default True
        DC-ASGD-a's adaptive λ.
    fetchEvery, pushEvery, numShards, placement
        As in :class:`~irbis.train.strategies.downpour.Downpour`.
    serverOptimizer : str, default "sgd"
        The rule applied to the compensated gradient (the paper uses SGD).

    Examples
    --------
    >>> DCASGD(lambda_=0.5, adaptive=False)
    DCASGD(fetchEvery=1, pushEvery=1, serverOptimizer='sgd', numShards=0, placement='colocated', lambda_=0.5, adaptive=False)
    """

    name = "dcasgd"

    def __init__(self, lambda_: float = 2.0, adaptive: bool = True, fetchEvery: int = 1, pushEvery: int = 1,
                 serverOptimizer: str = "sgd", numShards: int = 0, placement: str = "colocated") -> None:
        if isinstance(lambda_, bool) or not isinstance(lambda_, (int, float)) or not lambda_ >= 0:
            raise ValueError(f"lambda_ must be a number >= 0, found {lambda_!r}")
        if not isinstance(adaptive, bool):
            raise ValueError(f"adaptive must be true or false, found {adaptive!r}")
        super().__init__(fetchEvery, pushEvery, serverOptimizer, numShards, placement)
        self.lambda_, self.adaptive = float(lambda_), adaptive

    def options(self) -> dict[str, Any]:
        return {**super().options(), "lambda_": self.lambda_, "adaptive": self.adaptive}

    def shard_options(self, ctx: WorkerContext | None) -> dict[str, Any]:
        return {**super().shard_options(ctx), "lambda_": self.lambda_, "adaptive": self.adaptive}
