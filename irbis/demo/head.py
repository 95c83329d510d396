"""The +T rung's MLP head: its hyperparameters chosen by camera-grouped cross-validation (pure torch).

+T replaces +E's logistic regression by a small MLP trained by :class:`irbis.ml.TorchEstimator` on the
standardised features of the training cameras' images and their augmented copies. Its width, weight
decay and number of epochs are chosen as the regression's ``regParam`` is: on the camera-grouped folds
of the training cameras, by the mean validation ROC AUC, never looking at a test camera. The folds are
small (a few thousand rows of a few hundred or thousand features), so they are trained here, on the
driver, with the same architecture (:func:`irbis.models.small.mlp`), loss, optimizer, learning rate and
global batch as the data-parallel fit (two workers of ``BATCH // 2`` rows with synchronous SGD see
``BATCH`` rows per step); the epochs of :data:`EPOCHS` are read along one run per setting.

With a handful of training cameras the settings' mean AUCs often differ by less than their noise, so
the choice follows the one-standard-error rule (Hastie, Tibshirani and Friedman, *The Elements of
Statistical Learning*, 7.10): the simplest setting (smallest width, then largest weight decay, then
fewest epochs) whose mean AUC is within one standard error (over the folds) of the best mean. The CV
is deterministic for a given seed: the rows come in the caller's order (the demo sorts them by a
stable key), every setting starts from the same seeded weights and batch order, and the driver's
torch runs single-threaded during it (:data:`CV_THREADS`), so the sums do not depend on the machine.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> x = rng.normal(size=(120, 8)).astype(np.float32); y = (x[:, 0] > 0).astype(np.int64)
>>> best, table = cross_validate_head(x, y, np.arange(120) % 3, grid={"hidden": (8,), "weight_decay": (1e-4,)},
...                                   epochs=(2, 4))
>>> sorted(best)
['best_cv_auc', 'cv_auc', 'cv_se', 'epochs', 'hidden', 'weight_decay']
"""
from __future__ import annotations

from contextlib import contextmanager
from itertools import product
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn

from irbis.demo.stats import roc_auc
from irbis.models.small import mlp

__all__ = ["BATCH", "CV_THREADS", "DECAY_OPTIMIZERS", "EPOCHS", "HEAD_GRID", "LEARNING_RATE", "adam_decay_1e2",
           "adam_decay_1e4", "cross_validate_head", "one_standard_error", "standardize", "train_head"]

#: Adam's learning rate and the global mini-batch (both fixed; the grid below is what CV chooses).
LEARNING_RATE, BATCH = 1e-3, 128
#: The grid: hidden width x weight decay (L2, as the regression's regParam); kept tiny (time matters).
HEAD_GRID: dict[str, tuple[float, ...]] = {"hidden": (32, 128), "weight_decay": (1e-4, 1e-2)}
#: Epoch counts compared, each read along the same run of a setting.
EPOCHS = (10, 20, 40)
#: Torch threads of the driver while the CV trains (restored after): one, so that its sums, hence its
#: scores and choice, are the same whatever the machine's core count.
CV_THREADS = 1


def adam_decay_1e4(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """Adam with weight decay 1e-4 (an importable factory, so the fitted estimator's optimizer is saved by name)."""
    return torch.optim.Adam(params, lr=LEARNING_RATE, weight_decay=1e-4)


def adam_decay_1e2(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """Adam with weight decay 1e-2 (an importable factory, as :func:`adam_decay_1e4`)."""
    return torch.optim.Adam(params, lr=LEARNING_RATE, weight_decay=1e-2)


#: The optimizer factory of each weight decay of :data:`HEAD_GRID` (the one place the pairing lives).
DECAY_OPTIMIZERS: dict[float, Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]] = {
    1e-4: adam_decay_1e4, 1e-2: adam_decay_1e2}


def standardize(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """``train`` and ``others`` centred and scaled by ``train``'s per-feature mean and standard deviation."""
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return [((a - mean) / std).astype(np.float32) for a in (train, *others)]


def train_head(x: np.ndarray, y: np.ndarray, hidden: int, weight_decay: float, epochs: int, seed: int = 0,
               on_epoch: Callable[[int, nn.Module], None] | None = None) -> nn.Module:
    """An MLP ``d -> hidden -> 2`` trained with cross-entropy and :data:`DECAY_OPTIMIZERS` ``[weight_decay]``.

    ``on_epoch(epoch, module)`` is called after each epoch (1-based), e.g. to score a validation set.
    """
    if weight_decay not in DECAY_OPTIMIZERS:
        raise ValueError(f"weight_decay must be one of {sorted(DECAY_OPTIMIZERS)}, found {weight_decay}")
    module = mlp(x.shape[1], int(hidden), 2, seed=seed).train()
    optimizer = DECAY_OPTIMIZERS[weight_decay](module.parameters())
    data, target = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(y.astype(np.int64))
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(1, epochs + 1):
        module.train()
        for idx in torch.randperm(len(data), generator=gen).split(BATCH):
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(data[idx]), target[idx]).backward()
            optimizer.step()
        if on_epoch is not None:
            on_epoch(epoch, module.eval())
    return module.eval()


def _scores(module: nn.Module, x: np.ndarray) -> np.ndarray:
    """The logit margin of class 1: the softmax's order without its float32 saturation to ties at 0 and 1.

    ``x`` is copied into torch's own (aligned) memory, so the sums do not depend on where numpy put it.
    """
    with torch.inference_mode():
        logits = module(torch.tensor(x, dtype=torch.float32))
        return (logits[:, 1] - logits[:, 0]).numpy()


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_standard_error(per_fold: dict[tuple[int, float, int], list[float]]) -> tuple[tuple[int, float, int], float]:
    """The simplest setting within one standard error of the best mean AUC, and that standard error.

    ``per_fold`` maps ``(hidden, weight_decay, epochs)`` to its validation AUC on each fold. Simplest:
    smallest width, then largest weight decay, then fewest epochs (ties of the means fall the same way).
    """
    means = {key: float(np.nanmean(v)) for key, v in per_fold.items()}
    top = max(means, key=lambda k: (means[k], -k[0], k[1], -k[2]))
    scores = np.asarray(per_fold[top], np.float64)
    scores = scores[~np.isnan(scores)]
    se = float(scores.std(ddof=1) / np.sqrt(len(scores))) if len(scores) > 1 else 0.0
    within = [key for key, mean in means.items() if mean >= means[top] - se]
    return min(within, key=lambda k: (k[0], -k[1], k[2])), se


def cross_validate_head(x: np.ndarray, y: np.ndarray, fold: np.ndarray, seed: int = 0,
                        grid: dict[str, tuple[float, ...]] | None = None,
                        epochs: tuple[int, ...] = EPOCHS,
                        on_fit: Callable[[], None] | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    """The setting of ``grid`` x ``epochs`` chosen on the folds by the one-standard-error rule.

    ``fold`` holds each row's fold (whole cameras, from :func:`irbis.demo.ladder.camera_folds`); each
    fold is standardised with the statistics of its training part. The choice is the simplest setting
    whose mean validation ROC AUC is within one standard error of the best mean
    (:func:`one_standard_error`). Returns ``(best, table)``: the chosen ``hidden``, ``weight_decay``,
    ``epochs`` and ``cv_auc`` (its mean AUC), the best mean ``best_cv_auc`` and its standard error
    ``cv_se``; and every setting's mean AUC keyed ``"hidden/weight_decay/epochs"``. The same rows in
    the same order and the same ``seed`` give the same result. ``on_fit`` is called after each fold and
    setting of ``grid`` has trained (a progress bar's step).
    """
    grid = grid or HEAD_GRID
    if len(np.unique(fold)) < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, found {len(np.unique(fold))}")
    per_fold: dict[tuple[int, float, int], list[float]] = {}
    with _torch_threads(CV_THREADS):
        for k, (hidden, decay) in product(np.unique(fold), product(grid["hidden"], grid["weight_decay"])):
            train_x, val_x = standardize(x[fold != k], x[fold == k])
            val_y = y[fold == k]

            def record(epoch: int, module: nn.Module, h: int = int(hidden), d: float = float(decay)) -> None:
                if epoch in epochs:
                    per_fold.setdefault((h, d, epoch), []).append(roc_auc(val_y, _scores(module, val_x)))

            train_head(train_x, y[fold != k], int(hidden), float(decay), max(epochs), seed, record)
            if on_fit is not None:
                on_fit()
    table = {f"{h}/{d:g}/{e}": round(float(np.nanmean(v)), 4) for (h, d, e), v in per_fold.items()}
    (h, d, e), se = one_standard_error(per_fold)
    return {"hidden": h, "weight_decay": d, "epochs": e, "cv_auc": round(float(np.nanmean(per_fold[h, d, e])), 4),
            "best_cv_auc": max(table.values()), "cv_se": round(se, 4)}, table
