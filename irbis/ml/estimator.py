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

import contextlib
import dataclasses
import inspect
import io
import json
import logging
import posixpath
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from pyspark.ml.param import TypeConverters as T

from irbis.errors import ParamValueError
from irbis.kernels.engines import ENGINE_NAMES
from irbis.kernels.feed import FEED_PROCESSES_DOC, check_feed_processes
from irbis.kernels.image.augment import parse_augmentation
from irbis.kernels.inference import PRECISIONS
from irbis.ml.base import IrbisEstimator
from irbis.ml.params import (
    SHARED_PARAMS,
    HasDevice,
    HasInputDtype,
    HasInputShape,
    Row,
    at_least,
    in_range,
    one_of,
    parsed_by,
    row_named,
    rows_named,
    table_mixin,
)
from irbis.ml.torch_model import TorchModel
from irbis.ml.tracking import fit_is_tracked, log_fit
from irbis.refs import is_reference, is_unsaved, reference, resolve, unsaved
from irbis.train import checkpoint as ckpt
from irbis.train.auto_batch import DEFAULT_CANDIDATES, AutoBatch
from irbis.train.batchnorm import BATCHNORM_RECOMPUTE
from irbis.train.health import NAN_POLICIES
from irbis.train.loop import TRAINING_PRECISIONS, TrainSpec
from irbis.train.networks import Activated, build_network, network_spec
from irbis.train.optim import LOSSES, LR_SCALINGS, OPTIMIZERS, loss_entry, losses_doc, make_loss, validate_schedule
from irbis.train.strategies import STRATEGIES, make_strategy
from irbis.train.strategy import Strategy

_log = logging.getLogger(__name__)
_CALLABLE_PARAMS = ("network", "loss", "optimizer")


check_feed_processes_param = parsed_by(check_feed_processes, "'auto' or a count of processes (0 or more)",
                                       ("auto", "a count of processes"))
check_augmentation = parsed_by(parse_augmentation, "a JSON list of augmentation ops",
                               ("a JSON list of augmentation ops",))


def parse_class_weights(value: str) -> str | list[float] | None:
    """``classWeights`` as the loop takes it: None, ``"balanced"`` or a list of floats."""
    if not value:
        return None
    if value == "balanced":
        return value
    weights = json.loads(value)
    if not isinstance(weights, list) or not weights or not all(isinstance(w, (int, float)) and w >= 0
                                                                for w in weights):
        raise ValueError("a non-empty list of weights >= 0")
    return [float(w) for w in weights]


check_class_weights = parsed_by(parse_class_weights, "'', 'balanced' or a JSON list of one weight >= 0 per class",
                                ("balanced", "a JSON list of weights"))


def to_batch_size(value: Any) -> int | str:
    """``batchSize``'s converter: ``"auto"``, or an integer."""
    if value == "auto":
        return "auto"
    try:
        return T.toInt(value)
    except TypeError:
        raise ParamValueError("batchSize", value, "'auto' or an integer >= 1") from None


def check_batch_size(name: str, value: Any) -> None:
    if value != "auto" and value < 1:
        raise ParamValueError(name, value, "'auto' or an integer >= 1")


check_batch_size.bounds = (1, None, False, False)  # type: ignore[attr-defined]


def parse_auto_sizes(value: str) -> tuple[int, ...]:
    """``autoBatchSizes`` as the loop takes it: the candidate sizes (:class:`AutoBatch` orders them)."""
    sizes = json.loads(value)
    if not isinstance(sizes, list) or not sizes or not all(isinstance(b, int) and b >= 1 for b in sizes):
        raise ValueError("a non-empty list of integers >= 1")
    return tuple(sizes)


check_auto_sizes = parsed_by(parse_auto_sizes, "a JSON list of batch sizes, e.g. '[16, 32, 64]'",
                             ("a JSON list of batch sizes",))


#: TorchEstimator's own Params (name, doc, converter, default; None: unset); inputShape and device are
#: the shared rows of :mod:`irbis.ml.params`.
TRAIN_PARAMS: list[Row] = [
    ("network", "architecture name (irbis.models.ARCHITECTURES), TorchScript file path, or "
                "'package.module:function' naming a module factory", T.toString, None),
    ("networkOptions", "JSON object of keyword arguments for the architecture", T.toString, "{}"),
    ("loss", losses_doc(), T.toString, "cross_entropy",
     one_of(*LOSSES, or_ref=True)),
    ("optimizer", "'sgd', 'momentum', 'nesterov', 'adagrad', 'rmsprop', 'adam', or "
                  "'package.module:function' (params -> torch.optim.Optimizer)", T.toString, "adam",
     one_of(*OPTIMIZERS, or_ref=True)),
    ("learningRate", "learning rate", T.toFloat, 1e-3, in_range(0, low_open=True)),
    ("momentum", "momentum of 'momentum' and 'nesterov'", T.toFloat, 0.9, in_range(0, 1)),
    ("unitGain", "CNTK unit-gain momentum: v = m*v + (1-m)*g", T.toBoolean, False),
    ("learningRateSchedule", "JSON, e.g. {\"type\": \"step\", \"stepSize\": 10, \"gamma\": 0.5}; "
                             "types: constant, step, exponential, cosine (per epoch)", T.toString,
     '{"type": "constant"}'),
    ("lrScaling", "scale learningRate with the batch one update averages (numWorkers x batchSize under sync and "
                  "model averaging, whose gain block momentum's filter already applies; one worker's batch under "
                  "the parameter-server strategies, where each push is applied alone): 'none'; "
                  "'linear' (Goyal et al. 2017: times that batch / referenceBatchSize; "
                  "for sgd, momentum, nesterov); 'sqrt' (its square root; for adam, adagrad, rmsprop, or "
                  "where linear diverges)", T.toString, "none", one_of(*LR_SCALINGS)),
    ("referenceBatchSize", "the batch learningRate was chosen for, which lrScaling scales from; 0: batchSize "
                           "(one worker's: a rate tuned on one worker stays right as numWorkers grows)",
     T.toInt, 0, at_least(0)),
    ("warmupEpochs", "epochs over which lrScaling's factor climbs linearly, every step, from learningRate to the "
                     "scaled rate (Goyal et al.: 5); fewer than epochs; 0: the scaled rate from the first step",
     T.toFloat, 0.0, in_range(0)),
    ("recomputeBatchNorm", "BatchNorm running statistics after training: 'auto' (under every strategy, sync "
                           "included: recomputed under the final weights over up to 50 unaugmented batches of each "
                           "worker's rows, then averaged over the workers; layers frozen in eval mode keep "
                           "theirs), 'always', or 'never' (the running averages as training left them)",
     T.toString, "auto", one_of(*BATCHNORM_RECOMPUTE)),
    ("batchSize", "minibatch size per worker, or 'auto' (synchronous strategies: the largest of autoBatchSizes "
                  "that learns about as much as the smallest, searched on a held sample at the start and every "
                  "autoBatchEvery epochs, after Seide et al. 2014; pair it with lrScaling 'linear' or 'sqrt')",
     to_batch_size, 32, check_batch_size),
    ("autoBatchSizes", "batchSize='auto': JSON list of the candidate sizes per worker",
     T.toString, json.dumps(list(DEFAULT_CANDIDATES)), check_auto_sizes),
    ("autoBatchEvery", "batchSize='auto': epochs between searches", T.toInt, 1, at_least(1)),
    ("autoBatchTolerance", "batchSize='auto': a size is kept while it makes at least 1 - this of the smallest "
                           "size's progress on the sample", T.toFloat, 0.05, in_range(0, 1, low_open=True,
                                                                                       high_open=True)),
    ("epochs", "passes over the data", T.toInt, 10, at_least(1)),
    ("numWorkers", "training tasks, all run at once (one barrier stage; an ordinary stage, whose dead tasks are "
                   "retried alone, when the strategy places its shards on the driver)", T.toInt, 2, at_least(1)),
    ("strategy", "name in irbis.train.strategies.STRATEGIES", T.toString, "sync", one_of(*STRATEGIES)),
    ("strategyOptions", "JSON object of the strategy's options", T.toString, "{}"),
    ("inputCol", "input column: a vector or an array of numbers, token ids (array<int>) or steps of features "
                 "(array<array<float>>), their length varying per row, a Spark image struct (irbis.read_images), "
                    "or binary: encoded image files (binaryFile's content) when imagePreprocessing is set, else "
                    "tensor bytes of inputShape and inputDtype", T.toString, "features"),
    *rows_named(("inputCols", "inputShapes"), SHARED_PARAMS),
    row_named("imagePreprocessing", SHARED_PARAMS),
    ("augmentation", "JSON list of training-time image augmentations drawn per row, epoch and worker from seed "
                     "(irbis.kernels.image.augment: random_resized_crop, flip, rotate, color_jitter, grey, "
                     "each with a probability p); needs imagePreprocessing", T.toString, "[]", check_augmentation),
    ("shuffleBuffer", "rows a worker holds in memory: a share of numbers up to this many rows trains from "
                      "memory; a larger one, and images always, stream from a worker-local spill file, "
                      "reshuffled every epoch a window of about this many rows at a time (images: also at most "
                      "about 64 MiB of rows)", T.toInt, 10_000,
     at_least(1)),
    ("feedProcesses", FEED_PROCESSES_DOC, T.toString, "auto", check_feed_processes_param),
    row_named("tokenBudget", SHARED_PARAMS),
    ("classWeights", "cross_entropy class weights: empty (none), 'balanced' (n / (K * n_c) over the training "
                     "rows), or a JSON list of one weight per class", T.toString, "", check_class_weights),
    ("earlyStoppingPatience", "stop after this many epochs without a lower validation loss and keep the best "
                              "epoch's weights (0: never; needs validationFraction)", T.toInt, 0, at_least(0)),
    ("labelCol", "label column: a number per row (a class index under cross_entropy); under TorchEstimator's "
                 "vector losses (loss 'bce': multi-label, 'soft_cross_entropy': distributions, 'mse': vector "
                 "targets) a Spark ML vector or an array of numbers of the network's output width",
     T.toString, "label"),
    ("predictionCol", "output column of the fitted model", T.toString, "prediction"),
    ("validationFraction", "fraction of each worker's rows held out for per-epoch validation",
     T.toFloat, 0.0, in_range(0, 1, high_open=True)),
    ("checkpointDir", "directory for checkpoints that every executor sees, a shared mount or a URI pyarrow opens "
     "(hdfs://, s3://, gs://, abfs://); enables resume after a failed task",
     T.toString, None),
    ("checkpointInterval", "steps between checkpoints; 0 checkpoints at the end of every epoch",
     T.toInt, 0, at_least(0)),
    ("seed", "random seed (initial weights, shuffling, validation split)", T.toInt, 0),
    ("engine", "what runs the fitted model's network (its engine; training runs in torch): auto, torch, "
               "onnxruntime or openvino", T.toString, "auto", one_of(*ENGINE_NAMES)),
    ("precision", "numeric precision of the fitted model's network (its precision; training: trainingPrecision): "
                  "fp32, bf16 or int8", T.toString, "fp32", one_of(*PRECISIONS)),
    ("trainingPrecision", "the arithmetic of the training steps' forward and backward passes: 'fp32'; 'bf16': "
                          "autocast (matrix products and convolutions in bf16; weights, gradients, optimiser state "
                          "and what the workers exchange in fp32), fast on a GPU or a CPU with AMX or AVX-512 bf16; "
                          "'auto': bf16 for images on a GPU, fp32 elsewhere", T.toString, "auto",
     one_of(*TRAINING_PRECISIONS)),
    ("showProgress", "draw a progress bar on the driver (classic sessions)", T.toBoolean, True),
    ("nanPolicy", "rows whose features or label are not finite: 'error' stops the fit naming them, 'skip' "
                  "drops them (counted in the training summary)", T.toString, "error", one_of(*NAN_POLICIES)),
    ("mlflowRun", "log the fit to MLflow from the driver (irbis[mlflow]): the Params, each epoch's record of the "
                  "training summary as metrics (loss, validation loss and accuracy, samples per second, staleness) "
                  "and a loss-curve PNG, into a new run when none is active; a fit inside an active MLflow run logs "
                  "into it even when this is False", T.toBoolean, False),
]

HasTrainParams: Any = table_mixin("HasTrainParams", TRAIN_PARAMS, (HasInputShape, HasInputDtype, HasDevice))


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
    references (:mod:`irbis.refs`) and a strategy as its name + ``strategyOptions``. ``augment``
    (``f(batch: ndarray, rng) -> ndarray``, run in the prefetch thread) is not a
    Param and is not persisted. On a variable-length column (token ids) it gets the batch's rows before
    they are padded, an object array of 1-D int64 arrays, and returns as many rows (their lengths may
    change: token dropout, cropping).

    The column it reads is ``inputCol``, as on its fitted model; or, for a network whose ``forward`` takes
    several inputs, the columns of ``inputCols`` (with ``inputShapes``), passed to ``forward`` in that order.
    ``device``, ``engine`` and ``precision`` are passed to the fitted model.

    ``labelCol`` holds a number per row, or a vector per row for the vector losses of
    :data:`~irbis.train.optim.LOSSES`: ``bce`` (multi-label; the fitted model outputs per-class
    probabilities), ``soft_cross_entropy`` (label distributions) and ``mse`` (vector targets);
    :func:`irbis.vote_labels` makes such labels from annotators' votes.

    ``fit`` returns a :class:`~irbis.ml.TorchModel` whatever the rows, its ``outputCol`` the network's
    output under ``predictionCol``'s name; trained on images with ``imagePreprocessing``, the model
    carries that value and decodes and preprocesses images as the training did. For Spark ML's classifier
    outputs (``rawPrediction``, ``probability``, the class index) on images, fine-tune with
    :class:`~irbis.ml.ImageClassifier`, whose model is an :class:`~irbis.ml.ImageClassifierModel`.

    Examples
    --------
    >>> est = TorchEstimator(network="mlp", networkOptions='{"in_features": 64, "hidden": 128, '
    ...                      '"out_features": 10}', epochs=30, numWorkers=2)   # doctest: +SKIP
    >>> model = est.fit(train_df)                                             # doctest: +SKIP
    >>> model.training_summary[-1]["accuracy"]                                # doctest: +SKIP
    >>> tags = TorchEstimator(network="mypackage.nets:two_inputs", inputCols=["pixels", "meta"],
    ...                       inputShapes=[[1, 8, 8], [3]], labelCol="tags", loss="bce")  # doctest: +SKIP
    """

    #: The Model class that fit returns, whatever the rows: on images trained with imagePreprocessing it
    #: carries that value and reads images as they were trained.
    _model_class = TorchModel

    _extra_keywords = ("augment",)

    def _init_state(self) -> None:
        self._callables: dict[str, Callable[..., Any]] = {}
        self.augment: Callable[..., Any] | None = None
        self._lr_factors: dict[str, float] = {}  # parameter-name prefix -> learning-rate factor (ImageClassifier)
        self.last_spec: TrainSpec | None = None
        self._classes_param: str | None = None  # the Param that sets the network's classes (ImageClassifier)
        self.last_results: list[Any] | None = None

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Callables and strategy objects as Param values (see the class doc); ``augment`` kept aside."""
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
        return kwargs

    def fine_tune(self, lr_factors: dict[str, float], classes_param: str | None = None) -> TorchEstimator:
        """Train a pretrained network's layers at different rates (the stages that fine-tune a catalogue
        network through this estimator, ``ImageClassifier`` and ``TextClassifier``, call it).

        Parameters
        ----------
        lr_factors : dict of str to float
            Parameter-name prefix -> factor of the learning rate: the first prefix, in order, that a
            parameter's name starts with gives its factor (``""`` last for every other parameter).
        classes_param : str, optional
            The Param that sets the network's number of classes: labels outside ``[0, classes)`` are named by
            the workers' checks.
        """
        self._lr_factors = dict(lr_factors)
        self._classes_param = classes_param
        return self

    def _set(self, **kwargs: Any) -> TorchEstimator:
        """Set Params; ``strategy`` and ``strategyOptions`` are checked together against the registry, and
        ``inputCol`` and ``inputCols`` are exclusive."""
        cols = {"inputCol", "inputCols"}
        if cols & kwargs.keys() and all(kwargs.get(n) is not None or (n not in kwargs and self.isSet(n))
                                        for n in cols):
            raise ValueError("TorchEstimator: inputCol and inputCols are exclusive; set inputCols alone for a "
                             "network of several inputs (clear inputCol first: est.clear(est.inputCol))")
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
        warmup = self.getWarmupEpochs()
        if warmup and warmup >= self.getEpochs():
            raise ParamValueError("warmupEpochs", warmup, f"a number of epochs below epochs={self.getEpochs()}")
        if warmup and self.getLrScaling() == "none":
            raise ParamValueError("warmupEpochs", warmup, "0 while lrScaling is 'none' (the warm-up climbs from "
                                  "learningRate to the rate lrScaling gives: set lrScaling 'linear' or 'sqrt')")
        auto, batch = None, self.getBatchSize()
        if batch == "auto":
            if strategy.owns_update:
                raise ParamValueError("batchSize", batch, f"an integer with strategy {self.getStrategy()!r}: 'auto' "
                                      "suits the synchronous strategies (sync, one_bit, block_momentum, "
                                      "model_averaging); under a parameter server the staleness already depends "
                                      "on the step size, so a size changed mid-run moves both at once")
            auto = AutoBatch(parse_auto_sizes(self.getAutoBatchSizes()), self.getAutoBatchEvery(),
                             self.getAutoBatchTolerance())
            batch = auto.smallest
        # every grouped value named as a Param takes that Param's value; the rest are parsed or worked out
        params = {name: self.getOrDefault(name) for name in TrainSpec.names()
                  if self.hasParam(name) and self.isDefined(name)}
        return TrainSpec.of(
            network_spec(self._resolved("network"), self._options("networkOptions")),
            **{**params, "batchSize": batch, "auto_batch": auto, "optimizer": opt, "loss": self._resolved("loss"),
               "learningRateSchedule": validate_schedule(self._options("learningRateSchedule")),
               "strategyOptions": self._options("strategyOptions"),
               "classWeights": parse_class_weights(self.getClassWeights()), "augment": self.augment,
               "prefetch": self.augment is not None, "lr_factors": dict(self._lr_factors),
               "classes_param": self._classes_param, "checkpointDir": None}), strategy  # train_job: the run's folder

    def _input_format(self, dataset: Any, spec: TrainSpec) -> Any:
        """How the workers read the features column (:class:`~irbis.train.stream.InputFormat`); its ``shape``
        is the job's input shape (the preprocessing's for images, else ``spec.data.inputShape``). Raises naming
        the Param for a combination that cannot work."""
        from irbis.models import preprocessing_for
        from irbis.spark.columns import steps_of_features
        from irbis.spark.training import check_step_widths, input_kind
        from irbis.train.stream import InputFormat

        preprocessing = preprocessing_for(self.getImagePreprocessing())
        augmentation = parse_augmentation(self.getAugmentation())
        kind = input_kind(dataset, self.getInputCol(), "encoded" if preprocessing is not None else "tensor")
        col = self.getInputCol()
        if (augmentation or preprocessing is not None) and kind not in ("image", "encoded"):
            raise ParamValueError("imagePreprocessing" if preprocessing is not None else "augmentation",
                                  self.getImagePreprocessing() or self.getAugmentation(),
                                  f"empty for inputCol {col!r}, which holds numbers, not images")
        if augmentation and preprocessing is None:
            raise ParamValueError("augmentation", self.getAugmentation(),
                                  "'[]' unless imagePreprocessing is set (the augmentation draws the images' "
                                  "geometry at the network's input size)")
        if kind == "image" and preprocessing is None and spec.data.inputShape is None:
            raise ValueError(f"TorchEstimator: inputCol {col!r} holds images; set imagePreprocessing (a "
                             f"catalogue model, e.g. 'efficientnet_lite0') or inputShape (C, H, W) of images of "
                             f"one size")
        if kind == "tensor" and spec.data.inputShape is None:
            raise ValueError(f"TorchEstimator: inputCol {col!r} is binary: set imagePreprocessing when it holds "
                             f"encoded image files, or inputShape (and inputDtype) when it holds tensor bytes")
        shape = list(preprocessing.input_shape) if preprocessing is not None else spec.data.inputShape
        if kind == "sequence" and steps_of_features(dataset.schema[col].dataType):
            shape = [check_step_widths(dataset, col)]  # each step's features: the network's check takes them
        return InputFormat(kind, shape, self.getInputDtype(),
                           None if preprocessing is None else preprocessing.to_dict(), augmentation)

    def _joined_format(self, dataset: Any) -> tuple[Any, list[list[int]]]:
        """The input format of several input columns (``inputCols``): one flat row of their values side by
        side, numbers or tensor bytes; their shapes (``inputShapes``, else each column's width in its first
        row) go to the network spec, which :func:`~irbis.train.networks.build_network` wraps in
        :class:`~irbis.train.networks.SplitInputs`."""
        from irbis.spark.training import input_kinds, input_shapes
        from irbis.train.stream import InputFormat

        cols = self.getInputCols()
        for name in ("imagePreprocessing", "augmentation"):
            if self.getOrDefault(name) not in ("", "[]"):
                raise ParamValueError(name, self.getOrDefault(name), f"empty with inputCols {cols} (several "
                                      "input columns take numbers or tensor bytes, not images)")
        if self.isSet(self.inputShape):
            raise ParamValueError("inputShape", self.getInputShape(), f"unset with inputCols {cols}: give each "
                                  "column's row shape in inputShapes")
        kind = input_kinds(dataset, cols, self.getInputDtype())
        shapes = input_shapes(dataset, cols, self.getOrDefault(self.inputShapes) if self.isDefined(self.inputShapes)
                              else None, self.getInputDtype())
        total = sum(int(np.prod(s)) for s in shapes)
        return InputFormat(kind, [total], self.getInputDtype()), shapes

    # -- fit -------------------------------------------------------------------------------------
    def _fit(self, dataset: Any) -> Any:
        tracked = fit_is_tracked(self)
        spec, module, results = self.train_job(dataset)
        if spec.data.input_format.sequences:  # token ids: no one input shape
            model = self._fitted(module, spec.network, results, None)
        else:
            model = self._fitted(module, spec.network, results, spec.data.inputShape or [results[0].info["features"]])
        if tracked:
            log_fit(self, model.training_summary)
        return model

    def train_job(self, dataset: Any, counted: Any = None) -> tuple[TrainSpec, Any, list[Any]]:
        """The training job of :meth:`fit` without the fitted model: the job's spec, the network as built on
        the driver (its initial weights) and every worker's result (rank 0's carries the trained
        ``state_dict`` bytes), also kept as ``last_spec`` and ``last_results``. For a stage that stores the
        trained network its own way (a network that ``TorchModel`` cannot store).

        ``counted``: the frame whose rows are counted against ``numWorkers`` before the job, where counting
        ``dataset`` would compute an expensive column (``dataset`` by default)."""
        from irbis.spark.barrier import SparkBarrierBackend
        from irbis.spark.resources import check_device, driver_host, is_local_master
        from irbis.spark.training import IMAGE_BATCH_ROWS, arrow_batch_rows, train_partition, training_frame
        from irbis.train.ps.driver import served

        spec, strategy = self._spec()
        cols = self.getInputCols() if self.isDefined(self.inputCols) else None
        frame = training_frame(dataset, cols or self.getInputCol(), self.getLabelCol(),
                               binary_as="encoded" if self.getImagePreprocessing() else "tensor",
                               dtype=self.getInputDtype())
        if cols:  # the network takes the columns' values of one flat row, cut apart (SplitInputs)
            fmt, shapes = self._joined_format(dataset)
            spec = dataclasses.replace(spec, network={**spec.network, "inputs": shapes})
        else:
            fmt = self._input_format(dataset, spec)
        if spec.schedule.earlyStoppingPatience and not spec.data.validationFraction:
            raise ParamValueError("earlyStoppingPatience", spec.schedule.earlyStoppingPatience,
                                  "0 unless validationFraction > 0 (early stopping watches the validation loss)")
        check_device(dataset.sparkSession, spec.hardware.device)
        self._check_rows(frame if counted is None else counted)
        module = build_network(spec.network)
        checkpoint_dir = None
        if self.isDefined(self.checkpointDir):
            checkpoint_dir = posixpath.join(self.getCheckpointDir(), f"{self.uid}-{uuid.uuid4().hex[:8]}")
            ckpt.make_run_dir(checkpoint_dir)
            if "://" not in checkpoint_dir and not is_local_master(dataset.sparkSession):
                _log.warning("TorchEstimator: checkpointDir %r is a local path; the workers write it on the "
                             "executors' hosts and a retried task may run on another, so it must be a mount every "
                             "host shares, or give a URI (hdfs://, s3://, gs://, abfs://)", self.getCheckpointDir())
        session = dataset.sparkSession
        spec = spec.updated(input_format=fmt, inputShape=fmt.shape, checkpointDir=checkpoint_dir,
                            torch_threads=int(session.conf.get("spark.task.cpus", "1") or 1))
        columns = (", ".join(cols) if cols else self.getInputCol(), self.getLabelCol())
        server = self._progress_server(spec, session)
        try:
            workers = self.getNumWorkers()
            tasks = workers + strategy.server_tasks(workers)
            rows = IMAGE_BATCH_ROWS if spec.data.input_format.images else None
            with served(spec, strategy, workers, driver_host(session)) as spec, \
                    arrow_batch_rows(session, rows) if rows else contextlib.nullcontext(), \
                    SparkBarrierBackend(session, tasks, spec.hardware.device, data_ranks=workers,
                                        elastic=spec.parallel.ps_endpoint is not None) as backend:
                results = backend.run(partial(train_partition, spec, columns, server.endpoint() if server else None,
                                              num_workers=workers), frame)
        finally:
            if server is not None:
                server.close()
        self.last_results = results
        self.last_spec = spec
        for record in results[0].history:  # the training summary's warnings, for every stage that trains here
            if "warning" in record:
                _log.warning("%s: epoch %s: %s", type(self).__name__, record.get("epoch"), record["warning"])
        return spec, module, results

    def _check_rows(self, frame: Any) -> None:
        """Refuse, before the barrier stage, a frame with fewer rows than numWorkers (one small job: ``take``
        scans one partition first and more only when it holds too few rows, where ``limit().count()`` reads
        every partition)."""
        from pyspark.sql import functions as F

        workers = self.getNumWorkers()
        found = len(frame.select(F.lit(1)).take(workers))
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
        return ProgressServer(spec.schedule.epochs, host=driver_host(session), desc=f"{spec.parallel.strategy}")

    def _fitted(self, module: Any, network: dict[str, Any], results: list[Any], shape: list[int] | None) -> Any:
        """The fitted TorchModel; ``shape`` None: the network was trained on token ids of varying length
        (``variableLength=True``). Trained on several input columns, it keeps the network as trained (cutting
        one flat row apart, :class:`~irbis.train.networks.SplitInputs`); under a loss whose fitted model applies
        an activation (:data:`~irbis.train.optim.LOSSES`: ``bce``'s sigmoid), the network ends with it
        (:class:`~irbis.train.networks.Activated`)."""
        import torch

        module.load_state_dict(torch.load(io.BytesIO(results[0].state), weights_only=True))
        module.eval()
        arch = {"architecture": network["name"], "options": network["options"]} \
            if network["kind"] == "architecture" else {}
        params: dict[str, Any] = {"inputShape": shape} if shape is not None else {}
        if shape is None:
            params["variableLength"] = True
        if self.getImagePreprocessing():  # it reads images as they were trained
            params["imagePreprocessing"] = self.getImagePreprocessing()
        if network.get("inputs"):  # from_module wraps the network of several inputs again
            params.update(inputCols=self.getInputCols(), inputShapes=network["inputs"])
            module, arch = module.module, {}
        else:
            params["inputCol"] = self.getInputCol()
        entry = loss_entry(self.getLoss())
        if entry is not None and entry.activation == "sigmoid":  # per-class probabilities, as Spark ML's
            module, arch = Activated(module, torch.nn.Sigmoid()).eval(), {}  # probabilityCol
        model = TorchModel.from_module(module, outputCol=self.getPredictionCol(),
                                       device=self.getDevice(), engine=self.getEngine(),
                                       precision=self.getPrecision(), **params, **arch)
        model.training_summary = results[0].history
        return model


__all__ = ["STRATEGIES", "TRAIN_PARAMS", "TorchEstimator"]
