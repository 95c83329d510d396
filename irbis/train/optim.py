"""Optimizers, learning-rate schedules and losses picked by name.

``OPTIMIZERS``, ``SCHEDULES``, ``LR_SCALINGS`` and ``LOSSES`` are the registries behind
the estimator's ``optimizer``, ``learningRateSchedule``, ``lrScaling`` and ``loss`` Params.

The rate of a step is ``learningRate`` times :func:`rate_factor`: the schedule's factor for
the epoch (:func:`lr_at`) times the batch scaling's, which with warm-up climbs linearly from 1
to :func:`batch_scale` over the first ``warmupEpochs``.

Batch scaling (``lrScaling``) multiplies the rate by the batch one update of the model averages
(:func:`update_batch`) over a reference batch, the batch ``learningRate`` was chosen for:

* ``"linear"`` (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): k times the batch, k times
  the rate, so that one step on k batches moves the weights as k steps on one would. It fits
  ``sgd``, ``momentum`` and ``nesterov``, up to the batch where it breaks down (about 8k images
  for ResNet-50 on ImageNet there), and wants the warm-up: the large rate from the first step,
  while the weights change fast, is what makes such runs diverge (Goyal et al.: 5 epochs).
* ``"sqrt"`` (Krizhevsky 2014): keeps the variance of the update as the batch grows; the rule for
  ``adam`` and ``rmsprop`` (Malladi et al. 2022), suited to ``adagrad`` too (all three normalise
  their step by the gradient's scale), and a cautious one for SGD where linear diverges.
* ``"none"``: ``learningRate`` as given.

The reference is ``referenceBatchSize``, by default one worker's batch (``batchSize``): a rate tuned
on one worker then stays right as ``numWorkers`` grows (sync on 8 workers, linear: 8 times it),
and the parameter-server strategies, whose every push is applied alone, are left at it. A fixed
reference (Goyal et al.'s 256) suits a rate taken from a paper, where changing ``batchSize`` should
move the rate too. The warm-up runs per step (Goyal et al.'s gradual warm-up), not per epoch: a
jump at each epoch's start would repeat on a small scale the shock the warm-up is there to avoid,
and with few epochs (2 or 3 on a large data set) per-epoch steps would be few and large.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adagrad", "rmsprop", "adam")
SCHEDULES = ("constant", "step", "exponential", "cosine")
LR_SCALINGS = ("none", "linear", "sqrt")


@dataclass(frozen=True)
class Loss:
    """A loss picked by name: ``fn(output, target)``; the labels it takes (``labels``: ``"index"``, a class
    index per row; ``"number_or_vector"``, a number or a vector of the network's output width; ``"vector"``, a
    vector of that width); ``activation``: what the fitted model applies to the network's output
    (``"sigmoid"``: per-class probabilities; None: the output as it is); ``doc``: one line for the Param's doc;
    ``correct``: the validation rows' accuracy summed over a batch, for vector labels (class indices are
    counted by :func:`~irbis.train.evaluate.evaluate` itself; None: no accuracy)."""

    fn: LossFn
    labels: str
    doc: str
    activation: str | None = None
    correct: LossFn | None = None

    @property
    def label_dtype(self) -> Any:
        return np.int64 if self.labels == "index" else np.float32


def _mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if output.dim() == 2 and output.shape[1] == 1 and target.dim() == 1:
        output = output[:, 0]
    return torch.nn.functional.mse_loss(output, target)


def _bce(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if output.dim() == 2 and output.shape[1] == 1 and target.dim() == 1:
        output = output[:, 0]
    return torch.nn.functional.binary_cross_entropy_with_logits(output, target)


def _soft_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output, target)  # a float target of the output's shape: probabilities


def _labels_right(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Multi-label accuracy summed over the rows: each row's share of classes decided right (logit > 0 for a
    target > 0.5)."""
    right = (output.reshape(target.shape) > 0) == (target > 0.5)
    return right.float().reshape(len(target), -1).mean(1).sum()


def _top_class_right(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Rows whose top output is the target distribution's top class."""
    return (output.argmax(1) == target.argmax(1)).sum()


#: The losses the ``loss`` Param names; its doc and check are made from this table.
LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss(torch.nn.functional.cross_entropy, "index",
                          "softmax cross-entropy against a class index 0..K-1 per row (the model outputs logits)"),
    "mse": Loss(_mse, "number_or_vector", "mean squared error against a number, or a vector of the output's width"),
    "bce": Loss(_bce, "vector", "multi-label: a sigmoid per class and binary cross-entropy (BCEWithLogits) against "
                "a vector of 0/1 (or probabilities) of the output's width; the fitted model outputs per-class "
                "probabilities", activation="sigmoid", correct=_labels_right),
    "soft_cross_entropy": Loss(_soft_cross_entropy, "vector", "softmax cross-entropy against a label distribution "
                               "(soft targets: a vector of the output's width summing to 1 per row; the model "
                               "outputs logits)", correct=_top_class_right),
}


def loss_entry(loss: Any) -> Loss | None:
    """The registry's entry of a loss name; None for a callable (or a reference to one)."""
    return LOSSES.get(loss) if isinstance(loss, str) else None


def loss_label_dtype(loss: Any) -> Any:
    """The labels' dtype of a loss: int64 for class indices, float32 else (a callable's labels included)."""
    entry = loss_entry(loss)
    return entry.label_dtype if entry is not None else np.float32


def losses_doc() -> str:
    """The ``loss`` Param's doc, from :data:`LOSSES`."""
    return "; ".join(f"'{name}': {entry.doc}" for name, entry in LOSSES.items()) + \
        "; or 'package.module:function' (output, target) -> loss"


def make_optimizer(name: str | Callable[..., torch.optim.Optimizer], params: Iterable[torch.nn.Parameter],
                   learning_rate: float, momentum: float = 0.9, unit_gain: bool = False) -> torch.optim.Optimizer:
    """Build an optimizer by name, or call a ``torch.optim`` factory ``f(params)``.

    ``unit_gain`` (CNTK's unit-gain momentum, ``v = m·v + (1-m)·g``) applies to
    ``"momentum"`` and ``"nesterov"``; the update is linear in ``g``, so it is
    exactly plain momentum with learning rate ``lr·(1-m)``.
    """
    if callable(name):
        return name(params)
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)} or a callable, found {name!r}")
    lr = float(learning_rate)
    params = list(params)
    if name == "sgd":
        return _fused(torch.optim.SGD, params, lr=lr)
    if name in ("momentum", "nesterov"):
        eff = lr * (1.0 - momentum) if unit_gain else lr
        return _fused(torch.optim.SGD, params, lr=eff, momentum=momentum, nesterov=name == "nesterov")
    if name == "adagrad":
        return _fused(torch.optim.Adagrad, params, lr=lr)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    return _fused(torch.optim.Adam, params, lr=lr)


def _fused(kind: type[torch.optim.Optimizer], params: list[Any], **options: Any) -> torch.optim.Optimizer:
    """``kind`` with its fused kernel (one pass over each parameter's weights, gradient and state instead of
    an operation at a time, several times faster on a large network), where this torch has one for the
    parameters' device and dtype; else its default implementation.
    A data-parallel worker pays the step on every replica, so its share of a step is larger than in one
    process. The update is the same rule; the last bits of a float may differ from the default
    implementation's."""
    try:
        return kind(params, fused=True, **options)  # type: ignore[call-arg]  # the optimizers that have it
    except (RuntimeError, ValueError, TypeError):
        return kind(params, **options)


def validate_schedule(schedule: dict[str, Any] | None) -> dict[str, Any]:
    """Check a schedule such as ``{"type": "step", "stepSize": 10, "gamma": 0.5}``."""
    sched = dict(schedule or {"type": "constant"})
    kind = sched.get("type", "constant")
    if kind not in SCHEDULES:
        raise ValueError(f"learningRateSchedule type must be one of {list(SCHEDULES)}, found {kind!r}")
    if kind == "step" and int(sched.get("stepSize", 0)) < 1:
        raise ValueError(f"a 'step' schedule needs stepSize >= 1 (epochs), found {sched.get('stepSize')!r}")
    return sched


def lr_at(epoch: int, base: float, schedule: dict[str, Any] | None, epochs: int) -> float:
    """Learning rate for ``epoch`` (from 0) under ``schedule``."""
    sched = validate_schedule(schedule)
    kind, gamma = sched.get("type", "constant"), float(sched.get("gamma", 0.1))
    if kind == "step":
        return base * gamma ** (epoch // int(sched["stepSize"]))
    if kind == "exponential":
        return base * gamma ** epoch
    if kind == "cosine":
        return base * 0.5 * (1 + math.cos(math.pi * epoch / max(1, epochs)))
    return base


def update_batch(strategy: Any, batch_size: int, workers: int) -> float:
    """Rows whose mean gradient one update of the model follows, as the batch scaling counts them.

    Synchronous strategies (``sync``, ``one_bit``) and model averaging: every worker's batch, less
    ``backupWorkers``. Block momentum too, divided by the gain its filter already applies,
    ``blockLearningRate / (1 - blockMomentum)`` (N with the default ``1 - 1/N``: one worker's batch).
    Parameter-server strategies apply every push on its own: one worker's batch (``mixed``: its
    group's, ``groupSize`` batches averaged per update).
    """
    if getattr(strategy, "owns_update", False):
        return float(batch_size * getattr(strategy, "groupSize", 1))
    rows = float(batch_size * (workers - (getattr(strategy, "backupWorkers", 0) if workers > 1 else 0)))
    if callable(getattr(strategy, "eta", None)):  # block momentum's filter: a step of ζ / (1 - η) per block
        rows *= (1.0 - strategy.eta(workers)) / strategy.blockLearningRate
    return rows


def batch_scale(scaling: str, global_batch: float, reference_batch: float) -> float:
    """The factor ``lrScaling`` puts on the rate: ``global_batch / reference_batch`` (``"linear"``, Goyal et
    al. 2017), its square root (``"sqrt"``, Krizhevsky 2014) or 1 (``"none"``)."""
    if scaling not in LR_SCALINGS:
        raise ValueError(f"lrScaling must be one of {list(LR_SCALINGS)}, found {scaling!r}")
    if scaling == "none":
        return 1.0
    ratio = float(global_batch) / float(reference_batch)
    return ratio if scaling == "linear" else math.sqrt(ratio)


def warmup_factor(scale: float, progress: float, warmup_epochs: float) -> float:
    """The batch scaling's factor ``progress`` epochs into training: linear from 1 (the base rate) at 0 to
    ``scale`` at ``warmup_epochs``, ``scale`` after. A scale below 1 (a batch under the reference)
    applies from the start: there is no large rate to warm up to."""
    if scale <= 1.0 or warmup_epochs <= 0 or progress >= warmup_epochs:
        return scale
    return 1.0 + (scale - 1.0) * max(progress, 0.0) / warmup_epochs


def rate_factor(epoch: int, progress: float, schedule: dict[str, Any] | None, epochs: int, scale: float = 1.0,
                warmup_epochs: float = 0.0) -> float:
    """The factor on the base rate of a step ``progress`` epochs into training (``epoch`` its epoch):
    the schedule's (per epoch) times the batch scaling's (per step while warming up)."""
    return lr_at(epoch, 1.0, schedule, epochs) * warmup_factor(scale, progress, warmup_epochs)


def set_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Scale every group's initial learning rate by ``factor``."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * factor


def make_loss(loss: str | LossFn) -> LossFn:
    """A name of :data:`LOSSES`, or a callable ``f(output, target)``."""
    if callable(loss):
        return loss
    entry = loss_entry(loss)
    if entry is None:
        raise ValueError(f"loss must be one of {list(LOSSES)} or a callable, found {loss!r}")
    return entry.fn

def param_groups(model: torch.nn.Module, lr_factors: dict[str, float], learning_rate: float) -> Any:
    """The optimizer's parameters: one group, or one per prefix of ``lr_factors`` (its rate times the
    factor; the rest at the base rate). Frozen parameters (``requires_grad=False``) are left out."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not lr_factors:
        return [p for _, p in named]
    groups: dict[float, list[torch.nn.Parameter]] = {}
    for name, p in named:
        factor = next((f for prefix, f in lr_factors.items() if name.startswith(prefix)), 1.0)
        groups.setdefault(factor, []).append(p)
    return [{"params": ps, "lr": learning_rate * f} for f, ps in groups.items()]


class WeightedCrossEntropy:
    """Cross-entropy with class weights; classes the labels never reach (outputs beyond the weights) weigh 1."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        classes = output.shape[1]
        if len(self.weight) < classes:
            self.weight = torch.cat([self.weight, self.weight.new_ones(classes - len(self.weight))])
        return torch.nn.functional.cross_entropy(output, target, weight=self.weight[:classes])


def class_weights(weights: str | list[float], labels: np.ndarray, comm: Any) -> torch.Tensor:
    """Cross-entropy class weights: ``"balanced"`` gives class ``c`` the weight ``n / (K * n_c)`` over every
    worker's training rows (scikit-learn's rule; K is the largest label + 1), a list gives its own."""
    if not isinstance(weights, str):
        return torch.tensor(weights, dtype=torch.float32)
    labels = labels[np.isfinite(labels)].astype(np.int64)
    top = torch.tensor([float(labels.max()) if len(labels) else 0.0], dtype=torch.float64)
    k = int(max(t.item() for t in comm.all_gather(top))) + 1
    counts = torch.from_numpy(np.bincount(labels, minlength=k)[:k].astype(np.float64))
    comm.all_reduce_sum(counts)
    return (counts.sum() / (k * counts.clamp(min=1))).float()
