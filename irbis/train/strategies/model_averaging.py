"""Model averaging (periodic parameter averaging, "local SGD").

Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD" (the
averaging baseline), and Chen & Huo, ICASSP 2016, where it is BMUF with
block learning rate 1 and block momentum 0.

Each worker takes ``k`` local optimizer steps on its own data, then all
replicas are replaced by their mean:

.. math:: w_i \\leftarrow \\bar w = \\frac{1}{N} \\sum_{j=1}^{N} w_j
          \\quad \\text{every } k \\text{ steps.}

Optimizer state (momentum, Adam moments) stays local. Communication is one
all-reduce of the flat weight buffer per ``k`` steps. The strategy keeps no
state of its own: the optimizer's step count (checkpointed by the loop) says
when to average.
"""

from __future__ import annotations

from typing import Any

from irbis.train.strategy import FlatParams, Strategy, WorkerContext


def is_sync_step(step: int, period: int) -> bool:
    """True on steps ``period, 2·period, ...`` (``step`` counts from 1)."""
    return step % period == 0


class ModelAveraging(Strategy):
    """Average the weights every ``period`` local steps.

    Parameters
    ----------
    period : int, default 4
        ``k``, local steps between averages.

    Examples
    --------
    >>> ModelAveraging(period=8)
    ModelAveraging(period=8)
    """

    name = "model_averaging"
    averages_models = True

    def __init__(self, period: int = 4) -> None:
        if not isinstance(period, int) or isinstance(period, bool) or period < 1:
            raise ValueError(f"period must be an int >= 1, found {period!r}")
        self.period = period

    def options(self) -> dict[str, Any]:
        return {"period": self.period}

    def after_step(self, flat: FlatParams, ctx: WorkerContext, step: int) -> None:
        if is_sync_step(step, self.period):
            self._average(flat, ctx)

    def finalize(self, flat: FlatParams, ctx: WorkerContext) -> None:
        self._average(flat, ctx)

    def _average(self, flat: FlatParams, ctx: WorkerContext) -> None:
        ctx.comm.all_reduce_mean(flat.weights)
