"""The Params of :class:`irbis.train.TorchEstimator`, declared as a table."""

from __future__ import annotations

from pyspark.ml.param import Param, Params, TypeConverters

T = TypeConverters

#: (name, doc, converter, default); None defaults are left unset.
PARAM_TABLE: list[tuple[str, str, object, object]] = [
    ("network", "architecture name (irbis.models.ARCHITECTURES), TorchScript file path, or "
                "'python:module:function' naming a module factory", T.toString, None),
    ("networkOptions", "JSON object of keyword arguments for the architecture", T.toString, "{}"),
    ("inputShape", "shape of one example, e.g. [3, 32, 32]; features are reshaped to it", T.toListInt, None),
    ("loss", "'cross_entropy', 'mse', or 'python:module:function'", T.toString, "cross_entropy"),
    ("optimizer", "'sgd', 'momentum', 'nesterov', 'adagrad', 'rmsprop', 'adam', or "
                  "'python:module:function' (params -> torch.optim.Optimizer)", T.toString, "adam"),
    ("learningRate", "learning rate", T.toFloat, 1e-3),
    ("momentum", "momentum of 'momentum' and 'nesterov'", T.toFloat, 0.9),
    ("unitGain", "CNTK unit-gain momentum: v = m*v + (1-m)*g", T.toBoolean, False),
    ("learningRateSchedule", "JSON, e.g. {\"type\": \"step\", \"stepSize\": 10, \"gamma\": 0.5}; "
                             "types: constant, step, exponential, cosine (per epoch)", T.toString,
     '{"type": "constant"}'),
    ("batchSize", "minibatch size per worker", T.toInt, 32),
    ("epochs", "passes over the data", T.toInt, 10),
    ("numWorkers", "training tasks (one barrier stage, all run at once)", T.toInt, 2),
    ("strategy", "name in irbis.train.strategies.STRATEGIES", T.toString, "sync"),
    ("strategyOptions", "JSON object of the strategy's options", T.toString, "{}"),
    ("featuresCol", "features column (vector or array of numbers)", T.toString, "features"),
    ("labelCol", "label column (numeric)", T.toString, "label"),
    ("predictionCol", "output column of the fitted model", T.toString, "prediction"),
    ("validationFraction", "fraction of each worker's rows held out for per-epoch validation",
     T.toFloat, 0.0),
    ("checkpointDir", "shared directory for checkpoints (enables resume after a failed task)",
     T.toString, None),
    ("checkpointInterval", "steps between checkpoints; 0 checkpoints at the end of every epoch",
     T.toInt, 0),
    ("seed", "random seed (initial weights, shuffling, validation split)", T.toInt, 0),
    ("device", "'cpu' or 'cuda'", T.toString, "cpu"),
    ("showProgress", "draw a progress bar on the driver", T.toBoolean, True),
]


class HasTrainParams(Params):
    """Mixin declaring every row of :data:`PARAM_TABLE` with a getter."""


def _install() -> None:
    for name, doc, conv, _ in PARAM_TABLE:
        setattr(HasTrainParams, name, Param(Params._dummy(), name, doc, typeConverter=conv))
        getter = "get" + name[0].upper() + name[1:]
        setattr(HasTrainParams, getter, (lambda n: lambda self: self.getOrDefault(n))(name))
        setter = "set" + name[0].upper() + name[1:]
        if not hasattr(HasTrainParams, setter):
            setattr(HasTrainParams, setter, (lambda n: lambda self, v: self._set(**{n: v}))(name))


_install()


def defaults() -> dict[str, object]:
    """Defaults of the Params that have one."""
    return {name: d for name, _, _, d in PARAM_TABLE if d is not None}
