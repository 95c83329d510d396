"""The local surrogate of LIME: an exponential kernel on distances and a weighted ridge fit.

Ribeiro, Singh and Guestrin, "Why should I trust you?" (KDD 2016). Around one input ``x``, LIME draws
perturbed inputs ``z_s`` with interpretable codes ``c_s`` (superpixels on/off, standardised feature
values), scores them with the model, ``y_s = f(z_s)``, and fits a linear model ``y ≈ c·w + b``
weighted by the closeness of each sample to ``x``:

.. math::

    \\pi_s = \\sqrt{\\exp(-d_s^2 / \\sigma^2)}, \\qquad
    w = \\arg\\min_w \\sum_s \\pi_s (y_s - c_s w - b)^2 + \\alpha \\lVert w \\rVert^2

(the square root is the reference ``lime`` package's convention, kept so that the kernel widths mean
the same). The weights ``w`` are the explanation; the weighted :math:`R^2` of the fit says how well a
linear model describes the network near ``x``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["cosine_distance", "euclidean_distance", "exponential_kernel", "weighted_ridge"]


def exponential_kernel(distances: np.ndarray, width: float) -> np.ndarray:
    """Sample weights ``sqrt(exp(-d² / width²))`` for distances ``d`` (the ``lime`` package's kernel)."""
    if not width > 0:
        raise ValueError(f"the kernel width must be > 0, found {width}")
    d = np.asarray(distances, np.float64)
    return np.sqrt(np.exp(-(d ** 2) / width ** 2))


def cosine_distance(codes: np.ndarray, origin: np.ndarray | None = None) -> np.ndarray:
    """Cosine distance of each row of ``codes`` (S, F) to ``origin`` (default: all ones); 1 for a zero row."""
    codes = np.asarray(codes, np.float64)
    origin = np.ones(codes.shape[1]) if origin is None else np.asarray(origin, np.float64)
    norms = np.linalg.norm(codes, axis=1) * np.linalg.norm(origin)
    with np.errstate(invalid="ignore", divide="ignore"):
        similarity = np.where(norms > 0, codes @ origin / np.where(norms > 0, norms, 1.0), 0.0)
    return 1.0 - similarity


def euclidean_distance(codes: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """Euclidean distance of each row of ``codes`` (S, F) to ``origin`` (F,); for M sets at once, ``codes``
    (M, S, F) and ``origin`` (M, 1, F) give (M, S)."""
    return np.linalg.norm(np.asarray(codes, np.float64) - np.asarray(origin, np.float64), axis=-1)


def weighted_ridge(codes: np.ndarray, targets: np.ndarray, weights: np.ndarray,
                   alpha: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fit ``targets ≈ codes @ coef + intercept`` by weighted ridge regression, for K targets at once,
    and for M independent problems at once when the inputs have a leading axis of M.

    Parameters
    ----------
    codes : ndarray, shape (S, F) or (M, S, F)
        Interpretable representation of the S samples.
    targets : ndarray, shape (S, K) or (M, S, K)
        The model's scores of the samples, one column per explained class.
    weights : ndarray, shape (S,) or (M, S)
        Sample weights (the kernel of the distances).
    alpha : float
        L2 penalty on the coefficients (not on the intercept); 0 is weighted least squares.

    Returns
    -------
    coef : ndarray, shape (K, F) or (M, K, F)
    intercept : ndarray, shape (K,) or (M, K)
    r2 : ndarray, shape (K,) or (M, K)
        Weighted coefficient of determination of each fit (1 for a constant target fitted exactly).
    """
    x = np.asarray(codes, np.float64)
    single = x.ndim == 2
    x = x[None] if single else x
    y = np.asarray(targets, np.float64).reshape(*x.shape[:2], -1)
    w = np.asarray(weights, np.float64).reshape(x.shape[:2])
    if alpha < 0:
        raise ValueError(f"the regularization must be >= 0, found {alpha}")
    total = w.sum(axis=1)[:, None]
    x_mean = (w[:, None] @ x)[:, 0] / total  # batched matrix products (BLAS), not einsum: M x (S, F) at once
    y_mean = (w[:, None] @ y)[:, 0] / total
    xc, yc = x - x_mean[:, None], y - y_mean[:, None]
    wxt = (xc * w[:, :, None]).transpose(0, 2, 1)  # (M, F, S)
    gram = wxt @ xc
    diagonal = np.einsum("mff->mf", gram)  # a view: the ridge and a tiny jitter go on the diagonal
    diagonal += alpha + 1e-10 * (diagonal.sum(axis=1, keepdims=True) / max(gram.shape[1], 1) + 1.0)
    coef = np.linalg.solve(gram, wxt @ yc)  # (M, F, K)
    intercept = y_mean - (x_mean[:, None] @ coef)[:, 0]
    residual = (w[:, None] @ (yc - xc @ coef) ** 2)[:, 0]
    spread = (w[:, None] @ yc ** 2)[:, 0]
    r2 = np.where(spread > 0, 1.0 - residual / np.where(spread > 0, spread, 1.0), 1.0)
    coef = coef.transpose(0, 2, 1)
    return (coef[0], intercept[0], r2[0]) if single else (coef, intercept, r2)
