"""Superpixels of an image (SLIC) and the random on/off masks over them that LIME scores."""
from __future__ import annotations

import numpy as np

from irbis.extras import load

__all__ = ["mask_images", "superpixel_masks", "superpixels"]


def superpixels(image: np.ndarray, cell_size: int = 16, modifier: float = 130.0) -> np.ndarray:
    """Segment ``image`` (H, W[, C]) into superpixels of about ``cell_size`` pixels a side (SLIC).

    Parameters
    ----------
    image : ndarray, shape (H, W) or (H, W, C)
        Pixels in 0-255 (any channel order: only distances between colours matter).
    cell_size : int
        Side of a superpixel's grid cell in pixels.
    modifier : float
        SLIC's compactness on the 0-255 colour scale (SynapseML's meaning): larger values give more
        square superpixels, smaller ones follow colour edges more closely.

    Returns
    -------
    ndarray of int32, shape (H, W)
        Superpixel labels 0..F-1.
    """
    slic = load("skimage.segmentation", "explain").slic
    height, width = image.shape[:2]
    if cell_size < 1:
        raise ValueError(f"cellSize must be >= 1, found {cell_size}")
    if height < cell_size or width < cell_size:
        raise ValueError(f"the image of {height}x{width} pixels is smaller than one superpixel "
                         f"(cellSize={cell_size}); lower cellSize or use larger images")
    pixels = image[:, :, :3] if image.ndim == 3 else image
    colour = pixels.ndim == 3 and pixels.shape[2] == 3
    segments = max(1, (height // cell_size) * (width // cell_size))
    labels = slic(pixels.astype(np.float64) / 255.0, n_segments=segments,
                  compactness=modifier / 255.0 * (100.0 if colour else 1.0), start_label=0,
                  channel_axis=-1 if pixels.ndim == 3 else None, convert2lab=colour,
                  enforce_connectivity=True)
    # SLIC may skip labels; renumber them 0..F-1.
    return np.unique(labels, return_inverse=True)[1].reshape(height, width).astype(np.int32)


def superpixel_masks(rng: np.random.Generator, num_samples: int, num_features: int,
                     fraction: float = 0.7) -> np.ndarray:
    """``num_samples`` random on/off masks (S, F); each superpixel is on with probability ``fraction``.

    The first mask keeps every superpixel: the unperturbed image anchors the local fit.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"samplingFraction must be in (0, 1], found {fraction}")
    masks = rng.random((num_samples, num_features)) < fraction
    masks[0] = True
    return masks


def mask_images(image: np.ndarray, segments: np.ndarray, masks: np.ndarray,
                fill: float = 0) -> np.ndarray:
    """The image with the superpixels that are off in each mask set to ``fill``: (S, H, W, C)."""
    pixels = image if image.ndim == 3 else image[:, :, None]
    keep = masks[:, segments]  # (S, H, W)
    return np.where(keep[..., None], pixels[None], np.asarray(fill, pixels.dtype)).astype(pixels.dtype)
