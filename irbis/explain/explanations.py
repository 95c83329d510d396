"""LIME explanations of one image, one text or of table rows, with the model injected as a batch function.

The model is any :data:`ScoreFn`: a batch of inputs in, a ``(S, n)`` array of scores out (class
probabilities, logits, a regression output). The Spark stages pass the fitted model's own batch
kernels (see :mod:`irbis.ml.lime`), so the scores are those of the model's ordinary inference path.
Perturbed inputs are scored in mini-batches of ``batch_size`` rows.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from irbis.explain.fit import (
    cosine_distance,
    euclidean_distance,
    exponential_kernel,
    weighted_ridge,
)
from irbis.explain.segment import mask_images, superpixel_masks, superpixels

__all__ = ["Explanation", "FeatureStats", "ScoreFn", "check_num_samples", "check_targets",
           "explain_image", "explain_rows", "explain_text", "mask_text", "text_words"]

#: The model as LIME sees it: a batch of inputs (images (S, H, W, C) or rows (S, D)) to scores (S, n).
ScoreFn = Callable[[np.ndarray], np.ndarray]  # or of what ``inputs`` makes (explain_image)

#: Kernel width on the cosine distance of superpixel masks (the ``lime`` package's image default).
IMAGE_KERNEL_WIDTH = 0.25


@dataclass
class Explanation:
    """Weights of a local linear fit: one row per explained class, one column per feature/superpixel."""

    weights: np.ndarray  # (K, F)
    r2: np.ndarray  # (K,)
    segments: np.ndarray | None = None  # (H, W) superpixel labels, for images


def check_num_samples(num_samples: int, num_features: int, what: str = "features") -> None:
    """A local fit needs at least as many samples as features."""
    if num_samples < num_features:
        raise ValueError(f"numSamples={num_samples} is below the number of {what} ({num_features}); "
                         f"raise numSamples to at least {num_features}")


def check_targets(targets: Sequence[int], num_outputs: int, column: str = "target") -> None:
    """Every explained class must index the model's output of ``num_outputs`` values."""
    for t in targets:
        if not 0 <= t < num_outputs:
            raise ValueError(f"target class {t} is out of range: the model's {column!r} has "
                             f"{num_outputs} values (classes 0..{num_outputs - 1})")


def _score_batches(make: Callable[[int, int], Any], total: int, score: Callable[[Any], Any],
                   batch_size: int) -> np.ndarray:
    parts = []
    for start in range(0, total, max(1, batch_size)):
        out = np.asarray(score(make(start, min(total, start + batch_size))), np.float64)
        parts.append(out.reshape(len(out), -1))
    return np.concatenate(parts)


def explain_image(image: np.ndarray, score: ScoreFn, targets: Sequence[int], *, num_samples: int = 900,
                  cell_size: int = 16, modifier: float = 130.0, fraction: float = 0.7,
                  alpha: float = 0.0, seed: int = 0, batch_size: int = 64,
                  kernel_width: float = IMAGE_KERNEL_WIDTH, segments: np.ndarray | None = None,
                  target_name: str = "target",
                  inputs: Callable[[np.ndarray], object] | None = None) -> Explanation:
    """Explain ``score`` at ``image`` (H, W, C): one weight per superpixel and explained class.

    Superpixels (:func:`~irbis.explain.segment.superpixels`, unless ``segments`` are given) are
    switched off at random (set to black) in ``num_samples`` copies of the image, scored in batches
    of ``batch_size``, and a weighted ridge fit on the on/off masks gives each superpixel's weight.
    ``inputs`` turns a batch of masks (S, F) into what ``score`` takes; by default the masked
    full-size images (:func:`~irbis.explain.segment.mask_images`).
    """
    segments = superpixels(image, cell_size, modifier) if segments is None else segments
    num_features = int(segments.max()) + 1
    check_num_samples(num_samples, num_features, "superpixels of this image")
    masks = superpixel_masks(np.random.default_rng(seed), num_samples, num_features, fraction)
    make = inputs or (lambda batch: mask_images(image, segments, batch))
    scores = _score_batches(lambda a, b: make(masks[a:b]), num_samples, score, batch_size)
    check_targets(targets, scores.shape[1], target_name)
    weights = exponential_kernel(cosine_distance(masks), kernel_width)
    coef, _, r2 = weighted_ridge(masks, scores[:, list(targets)], weights, alpha)
    return Explanation(coef, r2, segments)


@dataclass
class FeatureStats:
    """Per-feature mean and standard deviation of background data: where table perturbations come from."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def from_data(cls, data: np.ndarray) -> "FeatureStats":
        """Statistics of the rows of ``data`` (N, D), ignoring NaN; a constant feature gets std 1."""
        data = np.asarray(data, np.float64)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN feature
            mean, std = np.nanmean(data, axis=0), np.nanstd(data, axis=0)
        return cls(np.nan_to_num(mean), np.where(np.isfinite(std) & (std > 0), std, 1.0))


def explain_rows(rows: np.ndarray, score: ScoreFn, stats: FeatureStats, targets: Sequence[int], *,
                 num_samples: int = 1000, alpha: float = 0.0, kernel_width: float | None = None,
                 seed: int = 0, batch_size: int = 8192,
                 target_name: str = "target") -> tuple[np.ndarray, np.ndarray]:
    """Explain ``score`` at each of ``rows`` (M, D): weights (M, K, D) and R² (M, K).

    Each row gets ``num_samples`` samples drawn from the background's normal ``N(mean, std²)`` (the
    first sample is the row itself); the fit is on standardised values, ``(x - mean) / std``, with
    the Euclidean distance to the row and a kernel width of ``0.75·sqrt(D)`` unless given: the
    ``lime`` package's continuous sampling. The samples of several rows share one model call.
    """
    rows = np.asarray(rows, np.float64)
    rows = rows.reshape(len(rows), -1) if len(rows) else rows.reshape(0, len(stats.mean))
    num_features = rows.shape[1]
    check_num_samples(num_samples, num_features)
    if not len(rows):
        return np.zeros((0, len(targets), num_features)), np.zeros((0, len(targets)))
    width = kernel_width or 0.75 * np.sqrt(num_features)
    rng = np.random.default_rng(seed)
    codes = rng.standard_normal((len(rows), num_samples, num_features), dtype=np.float32).astype(np.float64)
    codes[:, 0] = (rows - stats.mean) / stats.std
    samples = (codes * stats.std + stats.mean).reshape(-1, num_features)
    samples[::num_samples] = rows
    scores = _score_batches(lambda a, b: samples[a:b], len(samples), score, batch_size)
    check_targets(targets, scores.shape[1], target_name)
    scores = scores[:, list(targets)].reshape(len(rows), num_samples, -1)
    kernel = exponential_kernel(euclidean_distance(codes, codes[:, :1]), width)  # (M, S): each row's samples
    weights, _, r2 = weighted_ridge(codes, scores, kernel, alpha)  # every row's fit at once
    return weights, r2


#: A word of a text, as TextLIME switches it on and off: a run of word characters.
WORD_PATTERN = r"\w+"


def text_words(text: str) -> list[tuple[int, int]]:
    """The (start, stop) character span of each word of ``text``, in order."""
    import re

    return [m.span() for m in re.finditer(WORD_PATTERN, text)]


def mask_text(text: str, words: Sequence[tuple[int, int]], masks: np.ndarray) -> list[str]:
    """``text`` with the words that are off in each mask removed (the rest, separators included, kept)."""
    out = []
    for mask in masks:
        parts, last = [], 0
        for (start, stop), on in zip(words, mask):
            parts.append(text[last:start])
            if on:
                parts.append(text[start:stop])
            last = stop
        parts.append(text[last:])
        out.append("".join(parts))
    return out


def explain_text(text: str, score: ScoreFn, targets: Sequence[int], *, num_samples: int = 1000,
                 fraction: float = 0.7, alpha: float = 0.0, seed: int = 0, batch_size: int = 64,
                 kernel_width: float = IMAGE_KERNEL_WIDTH, target_name: str = "target") -> Explanation:
    """Explain ``score`` at ``text``: one weight per word (:func:`text_words`) and explained class.

    Words are removed at random (each kept with probability ``fraction``) in ``num_samples`` copies of the
    text (the first keeps them all), scored in batches of ``batch_size`` texts, and a weighted ridge fit of
    the scores on the on/off masks, weighted by the masks' cosine distance to the whole text (the ``lime``
    package's text kernel), gives each word's weight. ``segments`` holds the words' character spans (W, 2).
    """
    words = text_words(text)
    check_num_samples(num_samples, len(words), "words of this text")
    masks = superpixel_masks(np.random.default_rng(seed), num_samples, len(words), fraction)
    scores = _score_batches(lambda a, b: np.array(mask_text(text, words, masks[a:b]), dtype=object),
                            num_samples, score, batch_size)
    check_targets(targets, scores.shape[1], target_name)
    weights = exponential_kernel(cosine_distance(masks), kernel_width)
    coef, _, r2 = weighted_ridge(masks, scores[:, list(targets)], weights, alpha)
    return Explanation(coef, r2, np.array(words, dtype=np.int64).reshape(-1, 2))
