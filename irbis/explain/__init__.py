"""Explanations (LIME): pure kernels, pictures, and the Spark stages.

The kernels (:mod:`~irbis.explain.segment`, :mod:`~irbis.explain.fit`, :mod:`~irbis.explain.explanations`,
and the stages' kernel, :mod:`~irbis.explain.explainer`) and
the pictures (:mod:`~irbis.explain.plot`) import no Spark. The Spark stages built on them, ``ImageLIME``,
``TabularLIME`` and ``TabularLIMEModel``, are in :mod:`irbis.ml` (and ``irbis.ImageLIME``, ...): this
package is pure and imports nothing above it.

Examples
--------
>>> from irbis.ml import ImageLIME                                  # doctest: +SKIP
>>> from irbis.explain import plot_image_explanation                # doctest: +SKIP
"""
from __future__ import annotations

from irbis.explain.explanations import Explanation, FeatureStats, explain_image, explain_rows
from irbis.explain.fit import cosine_distance, euclidean_distance, exponential_kernel, weighted_ridge
from irbis.explain.plot import plot_feature_weights, plot_image_explanation, top_superpixels
from irbis.explain.segment import mask_images, superpixel_masks, superpixels

__all__ = [
    "Explanation", "FeatureStats", "cosine_distance", "euclidean_distance", "explain_image", "explain_rows",
    "exponential_kernel", "mask_images", "plot_feature_weights", "plot_image_explanation", "superpixel_masks",
    "superpixels", "top_superpixels", "weighted_ridge",
]

