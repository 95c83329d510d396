"""Confidence intervals for the demo's test metrics: a bootstrap over bursts (pure numpy).

Frames of one burst are near copies of each other, so the unit of resampling is the burst, not the
image: a bootstrap over images would count one trigger several times and give intervals too narrow.
Every variant is scored on the same resampled bursts, so the difference of two variants gets an
interval of its own (a paired bootstrap); a difference is significant when that interval excludes 0.

Examples
--------
>>> y = np.array([0, 0, 1, 1, 0, 1]); s = np.array([.1, .2, .8, .7, .4, .9]); g = np.array([0, 0, 1, 1, 2, 3])
>>> point, low, high = bootstrap_ci(accuracy, y, s, g)
>>> low <= point <= high
True
"""
from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["accuracy", "bootstrap_ci", "bootstrap_samples", "roc_auc"]

Metric = Callable[[np.ndarray, np.ndarray], float]


def accuracy(y: np.ndarray, s: np.ndarray) -> float:
    """Share of images whose score is on the right side of 0.5 (a score >= 0.5 predicts class 1)."""
    return float(np.mean((s >= 0.5) == (y == 1))) if len(y) else float("nan")


def roc_auc(y: np.ndarray, s: np.ndarray) -> float:
    """Area under the ROC curve: the probability that a positive outscores a negative (ties count half)."""
    pos, neg = s[y == 1], s[y == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    ranks = _midranks(np.r_[pos, neg])
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _midranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    first = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def bootstrap_samples(groups: np.ndarray, n_boot: int = 1000, seed: int = 0) -> list[np.ndarray]:
    """``n_boot`` index arrays, each the images of as many bursts as there are, drawn with replacement."""
    _, inverse = np.unique(np.asarray(groups), return_inverse=True)
    members = [np.flatnonzero(inverse == g) for g in range(inverse.max() + 1)] if len(inverse) else []
    if len(members) < 2:
        raise ValueError(f"a bootstrap over bursts needs at least 2 bursts, found {len(members)}")
    rng = np.random.default_rng(seed)
    return [np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
            for _ in range(n_boot)]


def bootstrap_ci(metric: Metric, y: np.ndarray, s: np.ndarray, groups: np.ndarray, *, n_boot: int = 1000,
                 level: float = 0.95, seed: int = 0, baseline: np.ndarray | None = None
                 ) -> tuple[float, float, float]:
    """``(point, low, high)``: ``metric(y, s)`` and its percentile interval over bursts ``groups``.

    With ``baseline`` (another variant's scores of the same images) the statistic is the difference
    ``metric(y, s) - metric(y, baseline)``, on the same resampled bursts (a paired bootstrap).
    Resamples where the metric is undefined (one class only, for the ROC AUC) are skipped.
    """
    y, s = np.asarray(y, np.float64), np.asarray(s, np.float64)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), found {level}")

    def stat(idx: np.ndarray | slice) -> float:
        value = metric(y[idx], s[idx])
        return value if baseline is None else value - metric(y[idx], np.asarray(baseline, np.float64)[idx])

    values = np.array([stat(idx) for idx in bootstrap_samples(groups, n_boot, seed)])
    values = values[~np.isnan(values)]
    point = stat(slice(None))
    if not len(values):
        return point, float("nan"), float("nan")
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return point, float(low), float(high)
