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

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "get_spark": "irbis.spark.session",
    "TorchModel": "irbis.ml.torch_model",
    "ONNXModel": "irbis.ml.onnx_model",
    "TorchEstimator": "irbis.ml.estimator",
    "ImageClassifier": "irbis.ml.image_classifier",
    "ImageClassifierModel": "irbis.ml.image_classifier_model",
    "read_images": "irbis.spark.images",
    "read_images_stream": "irbis.spark.images",
    "ImageReadStats": "irbis.spark.images",
    "ImageFeaturizer": "irbis.ml.image_featurizer",
    "ImageTransformer": "irbis.ml.image",
    "ImageDecoder": "irbis.ml.image",
    "ImageSetAugmenter": "irbis.ml.image",
    "UnrollImage": "irbis.ml.image",
    "EnsembleByKey": "irbis.ml.ensemble",
    "FastVectorAssembler": "irbis.ml.assembler",
    "TextFeaturizer": "irbis.ml.text",
    "Featurize": "irbis.ml.featurize",
    "ImageLIME": "irbis.ml.lime",
    "TabularLIME": "irbis.ml.lime",
    "ModelRepository": "irbis.models",
    "CatalogueEntry": "irbis.models",
    "MODELS": "irbis.models",
    "ARCHITECTURES": "irbis.models",
    "build_model": "irbis.models",
    "get_entry": "irbis.models",
    "register_model": "irbis.models",
    "register_catalogue": "irbis.models",
    "preprocess_rgb": "irbis.kernels.image_features",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return __all__
