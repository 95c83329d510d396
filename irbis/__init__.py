"""Irbis: deep networks as first-class stages of Apache Spark ML pipelines, with PyTorch as the engine.

The names below are imported on first use, so ``import irbis`` stays light (no JVM, no torch).

Examples
--------
>>> import irbis
>>> spark = irbis.get_spark()                                                  # doctest: +SKIP
>>> scorer = irbis.TorchModel(network="efficientnet_lite0", inputCol="pixels",
...                           outputCol="logits", inputShape=[3, 224, 224])    # doctest: +SKIP
"""

from __future__ import annotations

from irbis.refs import lazy_exports

__version__ = "0.1.0"

from irbis import ml as _ml  # the stages' table only: irbis.ml imports its stages on first use too

#: public name -> module that defines it: every public name of :mod:`irbis.ml` (its own table), and the
#: functions, catalogue and errors that the documentation names
_EXPORTS: dict[str, str] = {
    **_ml._EXPORTS,
    "get_spark": "irbis.spark.session",
    "read_images": "irbis.spark.images",
    "read_images_stream": "irbis.spark.images",
    "ImageReadStats": "irbis.spark.images",
    "score": "irbis.ml.score",
    "ScoreResult": "irbis.ml.score",
    "tensor_bytes": "irbis.spark.tensors",
    "tensor_bytes_column": "irbis.spark.tensors",
    "vote_labels": "irbis.spark.targets",
    "ModelRepository": "irbis.models",
    "CatalogueEntry": "irbis.models",
    "MODELS": "irbis.models",
    "ARCHITECTURES": "irbis.models",
    "build_model": "irbis.models",
    "get_entry": "irbis.models",
    "register_model": "irbis.models",
    "register_catalogue": "irbis.models",
    "preprocess_rgb": "irbis.kernels.image.network_input",
    "plot_image_explanation": "irbis.explain",
    "plot_feature_weights": "irbis.explain",
    "ColumnNotFoundError": "irbis.errors",
    "ParamValueError": "irbis.errors",
    "NonFiniteLossError": "irbis.errors",
    "NoKernelError": "irbis.errors",
    "ExecutorImportError": "irbis.errors",
    "MissingExtraError": "irbis.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return __all__
