"""Pictures of explanations: the top superpixels over an image, and feature weights as bars (PNG)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from irbis.extras import load, require

__all__ = ["figure", "plot_feature_weights", "plot_image_explanation"]


def figure(width: float, height: float, *grid: int, **options: Any) -> tuple[Any, Any]:
    """A matplotlib figure of ``width`` x ``height`` inches and its axes (``Figure.subplots(*grid,
    **options)``), drawn off screen, outside pyplot: the caller's backend (a notebook's inline one) is left
    as it is, and nothing needs closing. Irbis's saved plots (explanations, loss curves, the demo's
    report) all draw on one."""
    fig = load("matplotlib.figure", "explain").Figure(figsize=(width, height))
    return fig, fig.subplots(*grid, **options)


def _figure_png(fig: object, path: str | Path | None) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")  # type: ignore[attr-defined]
    data = buffer.getvalue()
    if path is not None:
        Path(path).write_bytes(data)
    return data


def top_superpixels(weights: np.ndarray, top: int = 5) -> np.ndarray:
    """Indices of the ``top`` superpixels with the largest positive weights, best first."""
    order = np.argsort(-np.asarray(weights, np.float64))
    return order[:top][np.asarray(weights)[order[:top]] > 0]


def plot_image_explanation(image: np.ndarray, segments: np.ndarray, weights: Sequence[float] | np.ndarray, *,
                           top: int = 5, title: str = "", path: str | Path | None = None,
                           bgr: bool = True) -> bytes:
    """The image with its ``top`` positively weighted superpixels outlined and the rest dimmed (PNG).

    Parameters
    ----------
    image : ndarray, shape (H, W, C)
        The explained image (BGR, as Spark's image structs hold it, unless ``bgr=False``).
    segments : ndarray, shape (H, W) or (H·W,)
        Superpixel labels (``superpixelCol`` of :class:`irbis.ml.ImageLIME`).
    weights : sequence of float
        One weight per superpixel for one target class.
    path : str or Path, optional
        Where to write the PNG as well.

    Returns
    -------
    bytes
        The PNG file.
    """
    require("plot_image_explanation", ["explain"])
    from skimage.segmentation import mark_boundaries

    pixels = np.asarray(image)
    pixels = pixels[:, :, None].repeat(3, axis=2) if pixels.ndim == 2 or pixels.shape[2] == 1 else pixels
    rgb = pixels[:, :, 2::-1] if bgr else pixels[:, :, :3]
    labels = np.asarray(segments).reshape(rgb.shape[:2])
    chosen = np.isin(labels, top_superpixels(np.asarray(weights), top))
    shown = np.where(chosen[..., None], rgb / 255.0, rgb / 255.0 * 0.3)
    fig, ax = figure(4, 4 * rgb.shape[0] / max(rgb.shape[1], 1))
    ax.imshow(mark_boundaries(shown, chosen.astype(int), color=(1, 0.85, 0)))
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=9)
    return _figure_png(fig, path)


def plot_feature_weights(weights: Sequence[float] | np.ndarray, names: Sequence[str] | None = None, *, top: int = 10,
                         title: str = "", path: str | Path | None = None) -> bytes:
    """A horizontal bar chart of the ``top`` features by absolute weight (PNG bytes); matplotlib draws it
    (``pip install 'irbis[explain]'``)."""
    require("plot_feature_weights", ["explain"])
    values = np.asarray(weights, np.float64)
    names = list(names) if names is not None else [f"feature {i}" for i in range(len(values))]
    if len(names) != len(values):
        raise ValueError(f"{len(names)} feature names for {len(values)} weights; give one name per weight")
    order = np.argsort(-np.abs(values))[:top][::-1]
    fig, ax = figure(5, 0.35 * len(order) + 1)
    ax.barh([names[i] for i in order], values[order],
            color=["#2a7" if values[i] > 0 else "#c44" for i in order])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("weight")
    if title:
        ax.set_title(title, fontsize=9)
    return _figure_png(fig, path)
