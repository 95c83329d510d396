"""Serving a fitted pipeline over HTTP: its stages' batch kernels on the request path, no Spark job.

``irbis serve PIPELINE_DIR`` or :func:`serve` from Python. See :mod:`irbis.serving.predictor`
(compiling a saved pipeline), :mod:`irbis.serving.batcher` (micro-batching) and
:mod:`irbis.serving.app` (the HTTP routes).
"""
from __future__ import annotations

from typing import Any

__all__ = ["serve"]


def serve(pipeline: Any, **kwargs: Any) -> None:
    """Serve ``pipeline`` over HTTP (see :func:`irbis.serving.server.serve`)."""
    from irbis.serving.server import serve as _serve

    _serve(pipeline, **kwargs)
