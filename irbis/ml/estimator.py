"""``TorchEstimator``: train a PyTorch network data-parallel on the Spark executors.

The estimator is a thin adapter: it checks the input on the driver, turns its
Params into a :class:`~irbis.train.loop.TrainSpec` of plain values, runs the
one training loop in a barrier stage (:mod:`irbis.train.backends.spark`) and
wraps rank 0's final weights in a fitted ``TorchModel`` with the per-epoch
training summary.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Callable
from typing import Any

from pyspark import keyword_only

from irbis.ml.base import IrbisEstimator
from irbis.train.loop import TrainSpec
from irbis.train.networks import build_network, network_spec
from irbis.train.optim import OPTIMIZERS, make_loss, validate_schedule
from irbis.train.params import HasTrainParams, defaults
from irbis.train.refs import callable_ref, is_ref, resolve_ref
from irbis.train.strategies import STRATEGIES, make_strategy
from irbis.train.strategy import Strategy

_CALLABLE_PARAMS = ("network", "loss", "optimizer")


class TorchEstimator(IrbisEstimator, HasTrainParams):
    """Data-parallel PyTorch training inside a Spark ML pipeline.

    ``network``, ``loss`` and ``optimizer`` also accept Python callables (a module
    factory, ``f(output, target)``, ``f(params)``) and ``strategy`` a strategy
    object; importable functions are persisted as ``python:module:function``
    references and a strategy as its name + ``strategyOptions``. ``augment``
    (``f(batch: ndarray, rng) -> ndarray``, run in the prefetch thread) is not a
    Param and is not persisted.

    Examples
    --------
    >>> est = TorchEstimator(network="mlp", networkOptions='{"in_features": 64, "hidden": 128, '
    ...                      '"out_features": 10}', epochs=30, numWorkers=2)   # doctest: +SKIP
    >>> model = est.fit(train_df)                                             # doctest: +SKIP
    >>> model.training_summary[-1]["accuracy"]                                # doctest: +SKIP
    """

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._callables: dict[str, Callable[..., Any]] = {}
        self.augment: Callable[..., Any] | None = None
        self.last_results: list[Any] | None = None
        self._setDefault(**defaults())
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Set Params by keyword (callables and strategy objects accepted, see the class doc)."""
        kwargs = dict(self._input_kwargs)
        if "augment" in kwargs:
            self.augment = kwargs.pop("augment")
        strategy = kwargs.get("strategy")
        if isinstance(strategy, Strategy):
            kwargs["strategy"], kwargs["strategyOptions"] = strategy.name, json.dumps(strategy.options())
        for name in _CALLABLE_PARAMS:
            value = kwargs.get(name)
            if callable(value) and not isinstance(value, str):
                ref = callable_ref(value)
                self._callables[name] = value
                kwargs[name] = ref or f"python:<unsaved {name}>"
        unknown = set(kwargs) - {p.name for p in self.params}
        if unknown:
            raise TypeError(f"TorchEstimator got unknown arguments {sorted(unknown)}")
        self._set(**kwargs)
        return self

    def write(self) -> Any:
        unsaved = [n for n in _CALLABLE_PARAMS if self.isSet(n) and "<unsaved" in self.getOrDefault(n)]
        if unsaved:
            raise ValueError(f"TorchEstimator: {unsaved} are lambdas or closures and cannot be saved; "
                             "pass importable top-level functions (saved as python:module:function)")
        return super().write()

    # -- driver-side resolution --------------------------------------------------------------
    def _resolved(self, name: str) -> Any:
        value = self.getOrDefault(name)
        if name in self._callables:
            return self._callables[name]
        return resolve_ref(value) if is_ref(value) else value

    def _options(self, name: str) -> dict[str, Any]:
        raw = self.getOrDefault(name)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{name} must be a JSON object, found {raw!r}: {err}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a JSON object, found {raw!r}")
        return value

    def _spec(self) -> TrainSpec:
        if not self.isDefined(self.network):
            raise ValueError("TorchEstimator: set network (an architecture name, TorchScript path or factory)")
        opt = self._resolved("optimizer")
        if not callable(opt) and opt not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)} or a callable, found {opt!r}")
        make_loss(self._resolved("loss"))
        make_strategy(self.getStrategy(), **self._options("strategyOptions"))
        for name, low in (("batchSize", 1), ("epochs", 1), ("numWorkers", 1), ("checkpointInterval", 0)):
            if self.getOrDefault(name) < low:
                raise ValueError(f"{name} must be >= {low}, found {self.getOrDefault(name)}")
        if not 0 <= self.getValidationFraction() < 1:
            raise ValueError(f"validationFraction must be in [0, 1), found {self.getValidationFraction()}")
        return TrainSpec(
            network=network_spec(self._resolved("network"), self._options("networkOptions")),
            epochs=self.getEpochs(), batch_size=self.getBatchSize(), optimizer=opt,
            learning_rate=self.getLearningRate(), momentum=self.getMomentum(), unit_gain=self.getUnitGain(),
            lr_schedule=validate_schedule(self._options("learningRateSchedule")), loss=self._resolved("loss"),
            strategy=self.getStrategy(), strategy_options=self._options("strategyOptions"),
            validation_fraction=self.getValidationFraction(), seed=self.getSeed(), device=self.getDevice(),
            input_shape=self.getOrDefault("inputShape") if self.isDefined(self.inputShape) else None,
            checkpoint_every=self.getCheckpointInterval(), augment=self.augment, prefetch=self.augment is not None)

    # -- fit -------------------------------------------------------------------------------------
    def _fit(self, dataset: Any) -> Any:
        from irbis.train.backends.spark import run_spark, training_frame
        from irbis.train.progress import ProgressServer

        from irbis.spark.session import require_classic

        require_classic(dataset, "TorchEstimator.fit", "barrier RDD stages (rdd.barrier)")
        spec = self._spec()
        frame = training_frame(dataset, self.getFeaturesCol(), self.getLabelCol())
        module = build_network(spec.network)
        if self.isDefined(self.checkpointDir):
            spec.checkpoint_dir = os.path.join(self.getCheckpointDir(), f"{self.uid}-{uuid.uuid4().hex[:8]}")
            os.makedirs(spec.checkpoint_dir, exist_ok=True)
        sc = dataset.sparkSession.sparkContext
        spec.torch_threads = int(sc.getConf().get("spark.task.cpus", "1"))
        host = sc.getConf().get("spark.driver.host", "127.0.0.1")
        server = ProgressServer(spec.epochs, host=host, show=self.getShowProgress(), desc=f"{spec.strategy}")
        try:
            results = run_spark(frame, spec, self.getNumWorkers(), (self.getFeaturesCol(), self.getLabelCol()),
                                server.endpoint())
        finally:
            server.close()
        self.last_results = results
        return self._fitted(module, spec.network, results, spec.input_shape or [results[0].info["features"]])

    def _fitted(self, module: Any, network: dict[str, Any], results: list[Any], shape: list[int]) -> Any:
        import torch

        module.load_state_dict(torch.load(io.BytesIO(results[0].state), weights_only=True))
        module.eval()
        arch = {"architecture": network["name"], "options": network["options"]} \
            if network["kind"] == "architecture" else {}
        model = _torch_model_class().from_module(module, inputCol=self.getFeaturesCol(),
                                                 outputCol=self.getPredictionCol(), inputShape=shape, **arch)
        model.training_summary = results[0].history
        return model


def _torch_model_class() -> Any:
    from irbis.ml.torch_model import TorchModel

    return TorchModel


__all__ = ["STRATEGIES", "TorchEstimator"]
