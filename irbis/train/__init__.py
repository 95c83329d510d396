"""Distributed training on Spark executors.

``TorchEstimator`` (a Spark ML Estimator) is imported lazily so that the pure
parts of this package (strategies, communicators, the loop) load without pyspark.

Examples
--------
>>> from irbis.train import TorchEstimator                 # doctest: +SKIP
>>> from irbis.train.strategies import STRATEGIES, make_strategy
>>> sorted(STRATEGIES)
['block_momentum', 'model_averaging', 'one_bit', 'sync']
"""

from __future__ import annotations

from typing import Any

__all__ = ["TorchEstimator", "plot_loss_curves"]


def __getattr__(name: str) -> Any:
    if name == "TorchEstimator":
        from irbis.train.estimator import TorchEstimator

        return TorchEstimator
    if name == "plot_loss_curves":
        from irbis.train.progress import plot_loss_curves

        return plot_loss_curves
    raise AttributeError(f"module 'irbis.train' has no attribute {name!r}")
