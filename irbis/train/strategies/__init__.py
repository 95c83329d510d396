"""Training strategies, picked by name.

``STRATEGIES`` maps each registry name to its class; it is the source of the
estimator's ``strategy`` Param validation and of the conformance suite.

Examples
--------
>>> make_strategy("block_momentum", blockSize=4)
BlockMomentum(blockSize=4, blockLearningRate=1.0, blockMomentum=None, nesterov=False)
"""

from __future__ import annotations

from typing import Any

from irbis.train.strategies.block_momentum import BlockMomentum
from irbis.train.strategies.dcasgd import DCASGD
from irbis.train.strategies.downpour import Downpour
from irbis.train.strategies.mixed import MixedSync
from irbis.train.strategies.model_averaging import ModelAveraging
from irbis.train.strategies.one_bit_sgd import OneBitSGD
from irbis.train.strategies.sync_sgd import SyncSGD
from irbis.train.strategy import Strategy

STRATEGIES: dict[str, type[Strategy]] = {
    SyncSGD.name: SyncSGD,
    ModelAveraging.name: ModelAveraging,
    BlockMomentum.name: BlockMomentum,
    OneBitSGD.name: OneBitSGD,
    Downpour.name: Downpour,
    MixedSync.name: MixedSync,
    DCASGD.name: DCASGD,
}


def make_strategy(name: str, **options: Any) -> Strategy:
    """Build the strategy registered as ``name`` with its options.

    Raises
    ------
    ValueError
        If ``name`` is not in :data:`STRATEGIES` or an option is unknown.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {sorted(STRATEGIES)}, found {name!r}")
    try:
        return STRATEGIES[name](**options)
    except TypeError as err:
        raise ValueError(f"bad strategyOptions for {name!r}: {err}") from None


__all__ = ["STRATEGIES", "DCASGD", "BlockMomentum", "Downpour", "MixedSync", "ModelAveraging", "OneBitSGD",
           "Strategy", "SyncSGD", "make_strategy"]
