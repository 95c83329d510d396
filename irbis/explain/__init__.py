"""Explanations (LIME): pure kernels, pictures, and the Spark stages.

The kernels (:mod:`~irbis.explain.segment`, :mod:`~irbis.explain.fit`, :mod:`~irbis.explain.lime`) and
the pictures (:mod:`~irbis.explain.plot`) import no Spark. The stages ``ImageLIME``, ``TabularLIME``
and ``TabularLIMEModel`` live in :mod:`irbis.ml.lime` and are imported from here on first use.

Examples
--------
>>> from irbis.explain import ImageLIME, plot_image_explanation   # doctest: +SKIP
"""
from __future__ import annotations

import importlib
from typing import Any

from irbis.explain.fit import cosine_distance, euclidean_distance, exponential_kernel, weighted_ridge
from irbis.explain.lime import Explanation, FeatureStats, explain_image, explain_rows
from irbis.explain.plot import plot_feature_weights, plot_image_explanation, top_superpixels
from irbis.explain.segment import mask_images, superpixel_masks, superpixels

_STAGES = {"ImageLIME": "irbis.ml.lime", "TabularLIME": "irbis.ml.lime", "TabularLIMEModel": "irbis.ml.lime"}

__all__ = sorted(_STAGES) + [
    "Explanation", "FeatureStats", "cosine_distance", "euclidean_distance", "explain_image", "explain_rows",
    "exponential_kernel", "mask_images", "plot_feature_weights", "plot_image_explanation", "superpixel_masks",
    "superpixels", "top_superpixels", "weighted_ridge",
]


def __getattr__(name: str) -> Any:
    if name in _STAGES:
        return getattr(importlib.import_module(_STAGES[name]), name)
    raise AttributeError(f"module 'irbis.explain' has no attribute {name!r}")
