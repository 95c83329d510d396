"""``TorchEstimator``: train a PyTorch network data-parallel on the Spark executors.

The estimator is a thin adapter: it checks the input on the driver, turns its
Params into a :class:`~irbis.train.loop.TrainSpec` of plain values, runs the
one training loop on every rank of a :class:`~irbis.spark.barrier.SparkBarrierBackend`
(one barrier stage, on a classic or a Spark Connect session; an ordinary stage whose
dead tasks are retried alone when the strategy serves its shards from the driver,
:mod:`irbis.train.ps.driver`) and wraps rank 0's
final weights in a fitted ``TorchModel`` with the per-epoch training summary.
Its Params are table rows (:data:`TRAIN_PARAMS`) turned into a mixin by the one
Param mechanism of :mod:`irbis.ml.params`, which also declares the Params it
shares with the inference stages (``inputShape``, ``device``).
"""

from __future__ import annotations

import inspect
import io
import json
import logging
import os
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from pyspark import keyword_only
from pyspark.ml.param import TypeConverters as T

from irbis.errors import ParamValueError
from irbis.ml.base import IrbisEstimator
from irbis.ml.params import HasDevice, HasInputShape, Row, at_least, in_range, one_of, table_mixin
from irbis.ml.torch_model import TorchModel
from irbis.refs import canonical, is_reference, is_unsaved, reference, resolve, unsaved
from irbis.train.health import NAN_POLICIES
from irbis.train.loop import TrainSpec
from irbis.train.networks import build_network, network_spec
from irbis.train.optim import LOSSES, OPTIMIZERS, make_loss, validate_schedule
from irbis.train.strategies import STRATEGIES, make_strategy
from irbis.train.strategy import Strategy

_log = logging.getLogger(__name__)
_CALLABLE_PARAMS = ("network", "loss", "optimizer")


def to_name_or_reference(value: Any) -> str:
    """A callable Param's converter: a string, its reference in the one format (saves of older stages too)."""
    return canonical(T.toString(value))


#: TorchEstimator's own Params (name, doc, converter, default; None: unset); inputShape and device are
#: the shared rows of :mod:`irbis.ml.params`.
TRAIN_PARAMS: list[Row] = [
    ("network", "architecture name (irbis.models.ARCHITECTURES), TorchScript file path, or "
                "'package.module:function' naming a module factory", to_name_or_reference, None),
    ("networkOptions", "JSON object of keyword arguments for the architecture", T.toString, "{}"),
    ("loss", "'cross_entropy', 'mse', or 'package.module:function'", to_name_or_reference, "cross_entropy",
     one_of(*LOSSES, or_ref=True)),
    ("optimizer", "'sgd', 'momentum', 'nesterov', 'adagrad', 'rmsprop', 'adam', or "
                  "'package.module:function' (params -> torch.optim.Optimizer)", to_name_or_reference, "adam",
     one_of(*OPTIMIZERS, or_ref=True)),
    ("learningRate", "learning rate", T.toFloat, 1e-3, in_range(0, low_open=True)),
    ("momentum", "momentum of 'momentum' and 'nesterov'", T.toFloat, 0.9, in_range(0, 1)),
    ("unitGain", "CNTK unit-gain momentum: v = m*v + (1-m)*g", T.toBoolean, False),
    ("learningRateSchedule", "JSON, e.g. {\"type\": \"step\", \"stepSize\": 10, \"gamma\": 0.5}; "
                             "types: constant, step, exponential, cosine (per epoch)", T.toString,
     '{"type": "constant"}'),
    ("batchSize", "minibatch size per worker", T.toInt, 32, at_least(1)),
    ("epochs", "passes over the data", T.toInt, 10, at_least(1)),
    ("numWorkers", "training tasks, all run at once (one barrier stage; an ordinary stage, whose dead tasks are "
                   "retried alone, when the strategy places its shards on the driver)", T.toInt, 2, at_least(1)),
    ("strategy", "name in irbis.train.strategies.STRATEGIES", T.toString, "sync", one_of(*STRATEGIES)),
    ("strategyOptions", "JSON object of the strategy's options", T.toString, "{}"),
    ("featuresCol", "features column (vector or array of numbers)", T.toString, "features"),
    ("labelCol", "label column (numeric)", T.toString, "label"),
    ("predictionCol", "output column of the fitted model", T.toString, "prediction"),
    ("validationFraction", "fraction of each worker's rows held out for per-epoch validation",
     T.toFloat, 0.0, in_range(0, 1, high_open=True)),
    ("checkpointDir", "shared directory for checkpoints (enables resume after a failed task)",
     T.toString, None),
    ("checkpointInterval", "steps between checkpoints; 0 checkpoints at the end of every epoch",
     T.toInt, 0, at_least(0)),
    ("seed", "random seed (initial weights, shuffling, validation split)", T.toInt, 0),
    ("showProgress", "draw a progress bar on the driver (classic sessions)", T.toBoolean, True),
    ("nanPolicy", "rows whose features or label are not finite: 'error' stops the fit naming them, 'skip' "
                  "drops them (counted in the training summary)", T.toString, "error", one_of(*NAN_POLICIES)),
]

HasTrainParams = table_mixin("HasTrainParams", TRAIN_PARAMS, (HasInputShape, HasDevice))


def check_strategy(name: Any, options: Any) -> None:
    """Raise :class:`ParamValueError` unless ``options`` (JSON text) are valid options of strategy ``name``."""
    if name not in STRATEGIES:
        raise ParamValueError("strategy", name, "one of " + ", ".join(repr(s) for s in STRATEGIES))
    try:
        parsed = json.loads(options)
    except (TypeError, json.JSONDecodeError):
        parsed = None
    accepted = list(inspect.signature(STRATEGIES[name]).parameters)
    if not isinstance(parsed, dict):
        raise ParamValueError("strategyOptions", options, f"a JSON object of the options of {name!r}: {accepted}")
    unknown = sorted(set(parsed) - set(accepted))
    if unknown:
        raise ParamValueError("strategyOptions", options, f"options of strategy {name!r} only: {accepted} "
                              f"({unknown} are not among them; set strategy before strategyOptions)")
    try:
        make_strategy(name, **parsed)
    except ValueError as err:
        raise ParamValueError("strategyOptions", options, f"valid options of strategy {name!r}: {err}") from None


class TorchEstimator(IrbisEstimator, HasTrainParams):
    """Data-parallel PyTorch training inside a Spark ML pipeline.

    ``network``, ``loss`` and ``optimizer`` also accept Python callables (a module
    factory, ``f(output, target)``, ``f(params)``) and ``strategy`` a strategy
    object; importable functions are persisted as ``package.module:function``
    references (:mod:`irbis.refs`; the ``python:package.module:function`` of older saves still loads)
    and a strategy as its name + ``strategyOptions``. ``augment``
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
        self._slow_workers: dict[int, float] = {}  # tests and benchmarks only: rank -> slowdown factor
        self.last_results: list[Any] | None = None
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
                self._callables[name] = value
                try:
                    kwargs[name] = reference(value)
                except ValueError as err:
                    kwargs[name] = unsaved(str(err))
        unknown = set(kwargs) - {p.name for p in self.params}
        if unknown:
            raise TypeError(f"TorchEstimator got unknown arguments {sorted(unknown)}")
        self._set(**kwargs)
        return self

    def _set(self, **kwargs: Any) -> TorchEstimator:
        """Set Params; ``strategy`` and ``strategyOptions`` are checked together against the registry."""
        if {"strategy", "strategyOptions"} & kwargs.keys():
            name = kwargs["strategy"] if "strategy" in kwargs else self._current("strategy")
            options = kwargs["strategyOptions"] if "strategyOptions" in kwargs else self._current("strategyOptions")
            if name is not None and options is not None:  # both known (copy() sets Params one at a time)
                check_strategy(name, options)
        return super()._set(**kwargs)

    def _current(self, name: str) -> Any:
        param = self.getParam(name)
        return self._paramMap.get(param, self._defaultParamMap.get(param))

    def write(self) -> Any:
        reasons = {n: self.getOrDefault(n) for n in _CALLABLE_PARAMS
                   if self.isSet(n) and is_unsaved(self.getOrDefault(n))}
        if reasons:
            raise ValueError(f"TorchEstimator: {sorted(reasons)} cannot be saved ({'; '.join(reasons.values())}); "
                             "pass importable top-level functions (saved as package.module:function)")
        return super().write()

    # -- driver-side resolution --------------------------------------------------------------
    def _resolved(self, name: str) -> Any:
        value = self.getOrDefault(name)
        if name in self._callables:
            return self._callables[name]
        return resolve(value) if is_reference(value) else value

    def _options(self, name: str) -> dict[str, Any]:
        raw = self.getOrDefault(name)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{name} must be a JSON object, found {raw!r}: {err}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a JSON object, found {raw!r}")
        return value

    def _spec(self) -> tuple[TrainSpec, Strategy]:
        """The job's plain-value spec, and the strategy it names (built once, checked against numWorkers)."""
        if not self.isDefined(self.network):
            raise ValueError("TorchEstimator: set network (an architecture name, TorchScript path or factory)")
        opt = self._resolved("optimizer")
        if not callable(opt) and opt not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)} or a callable, found {opt!r}")
        make_loss(self._resolved("loss"))
        strategy = make_strategy(self.getStrategy(), **self._options("strategyOptions"))
        strategy.check_workers(self.getNumWorkers())
        return TrainSpec(
            network=network_spec(self._resolved("network"), self._options("networkOptions")),
            epochs=self.getEpochs(), batch_size=self.getBatchSize(), optimizer=opt,
            learning_rate=self.getLearningRate(), momentum=self.getMomentum(), unit_gain=self.getUnitGain(),
            lr_schedule=validate_schedule(self._options("learningRateSchedule")), loss=self._resolved("loss"),
            strategy=self.getStrategy(), strategy_options=self._options("strategyOptions"),
            validation_fraction=self.getValidationFraction(), seed=self.getSeed(), device=self.getDevice(),
            input_shape=self.getOrDefault("inputShape") if self.isDefined(self.inputShape) else None,
            checkpoint_every=self.getCheckpointInterval(), augment=self.augment, prefetch=self.augment is not None,
            slow_workers=dict(self._slow_workers), nan_policy=self.getNanPolicy()), strategy

    # -- fit -------------------------------------------------------------------------------------
    def _fit(self, dataset: Any) -> Any:
        from irbis.spark.barrier import SparkBarrierBackend
        from irbis.spark.resources import check_device, driver_host
        from irbis.spark.training import train_partition, training_frame
        from irbis.train.ps.driver import served

        spec, strategy = self._spec()
        frame = training_frame(dataset, self.getFeaturesCol(), self.getLabelCol())
        check_device(dataset.sparkSession, spec.device)
        self._check_rows(frame)
        module = build_network(spec.network)
        if self.isDefined(self.checkpointDir):
            spec.checkpoint_dir = os.path.join(self.getCheckpointDir(), f"{self.uid}-{uuid.uuid4().hex[:8]}")
            os.makedirs(spec.checkpoint_dir, exist_ok=True)
        session = dataset.sparkSession
        spec.torch_threads = int(session.conf.get("spark.task.cpus", "1") or 1)
        columns = (self.getFeaturesCol(), self.getLabelCol())
        server = self._progress_server(spec, session)
        try:
            workers = self.getNumWorkers()
            tasks = workers + strategy.server_tasks(workers)
            with served(spec, strategy, workers, driver_host(session)) as spec, \
                    SparkBarrierBackend(session, tasks, spec.device, data_ranks=workers,
                                        elastic=spec.ps_endpoint is not None) as backend:
                results = backend.run(partial(train_partition, spec, columns, server.endpoint() if server else None,
                                              num_workers=workers), frame)
        finally:
            if server is not None:
                server.close()
        self.last_results = results
        return self._fitted(module, spec.network, results, spec.input_shape or [results[0].info["features"]])

    def _check_rows(self, frame: Any) -> None:
        """Refuse, before the barrier stage, a frame with fewer rows than numWorkers (one small job)."""
        workers = self.getNumWorkers()
        found = frame.limit(workers).count()
        if found < workers:
            what = "is empty" if found == 0 else f"has only {found} rows"
            raise ValueError(f"TorchEstimator: the training DataFrame {what}, and each of numWorkers={workers} "
                             "training tasks needs rows; give more data or set numWorkers lower")

    def _progress_server(self, spec: TrainSpec, session: Any) -> Any:
        """The driver's progress bar; None with ``showProgress=False`` (rank 0 then sends nothing) and through
        Spark Connect, whose executors may not reach this client."""
        from irbis.spark.resources import driver_host
        from irbis.spark.session import is_connect
        from irbis.train.progress import ProgressServer

        if not self.getShowProgress():
            return None
        if is_connect(session):
            _log.info("TorchEstimator: no progress bar on a Spark Connect session (the executors may not "
                      "reach the client); the per-epoch records are in the fitted model's training_summary")
            return None
        return ProgressServer(spec.epochs, host=driver_host(session), desc=f"{spec.strategy}")

    def _fitted(self, module: Any, network: dict[str, Any], results: list[Any], shape: list[int]) -> Any:
        import torch

        module.load_state_dict(torch.load(io.BytesIO(results[0].state), weights_only=True))
        module.eval()
        arch = {"architecture": network["name"], "options": network["options"]} \
            if network["kind"] == "architecture" else {}
        model = TorchModel.from_module(module, inputCol=self.getFeaturesCol(),
                                                 outputCol=self.getPredictionCol(), inputShape=shape, **arch)
        model.training_summary = results[0].history
        for record in model.training_summary:
            if "warning" in record:
                _log.warning("TorchEstimator: %s", record["warning"])
        return model


__all__ = ["STRATEGIES", "TRAIN_PARAMS", "TorchEstimator"]
