"""Distributed training, pure: strategies, communicators, the one training loop, backends.

Nothing here imports pyspark or the Spark stages: the Spark ML estimator is
:class:`irbis.ml.TorchEstimator`, and the Spark barrier backend is
:mod:`irbis.spark.barrier`; both drive this package.

Examples
--------
>>> from irbis.train.strategies import STRATEGIES, make_strategy
>>> sorted(STRATEGIES)
['block_momentum', 'dcasgd', 'downpour', 'mixed', 'model_averaging', 'one_bit', 'sync']
"""

from __future__ import annotations

from typing import Any

__all__ = ["plot_loss_curves"]


def __getattr__(name: str) -> Any:
    if name == "plot_loss_curves":
        from irbis.train.progress import plot_loss_curves

        return plot_loss_curves
    raise AttributeError(f"module 'irbis.train' has no attribute {name!r}")
