"""Optimizers, learning-rate schedules and losses picked by name.

``OPTIMIZERS``, ``SCHEDULES`` and ``LOSSES`` are the registries behind the
estimator's ``optimizer``, ``learningRateSchedule`` and ``loss`` Params.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adagrad", "rmsprop", "adam")
SCHEDULES = ("constant", "step", "exponential", "cosine")
LOSSES = ("cross_entropy", "mse")


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
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name in ("momentum", "nesterov"):
        eff = lr * (1.0 - momentum) if unit_gain else lr
        return torch.optim.SGD(params, lr=eff, momentum=momentum, nesterov=name == "nesterov")
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    return torch.optim.Adam(params, lr=lr)


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


def set_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Scale every group's initial learning rate by ``factor``."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * factor


def make_loss(loss: str | LossFn) -> LossFn:
    """``"cross_entropy"`` (integer class labels), ``"mse"``, or a callable ``f(output, target)``."""
    if callable(loss):
        return loss
    if loss == "cross_entropy":
        return torch.nn.functional.cross_entropy
    if loss == "mse":
        return _mse
    raise ValueError(f"loss must be one of {list(LOSSES)} or a callable, found {loss!r}")


def _mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if output.dim() == 2 and output.shape[1] == 1 and target.dim() == 1:
        output = output[:, 0]
    return torch.nn.functional.mse_loss(output, target)
