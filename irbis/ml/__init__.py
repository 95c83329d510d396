"""Spark ML stages of Irbis (the adapters over the pure kernels).

``__all__`` lists every public stage; the conformance suite (tests/conformance) tests each one. The names
are imported on first use, so that a runtime that needs one module (the HTTP server reading a tabular
pipeline with :func:`load_local`) does not import every stage, torch included. The package's face,
``irbis``, re-exports every name of this table.
"""

from __future__ import annotations

from irbis.refs import lazy_exports

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Cache": "irbis.ml.basic",
    "DropColumns": "irbis.ml.basic",
    "EnsembleByKey": "irbis.ml.ensemble_by_key",
    "FastVectorAssembler": "irbis.ml.assembler",
    "Featurize": "irbis.ml.featurize",
    "FeaturizeModel": "irbis.ml.featurize",
    "FusedStages": "irbis.ml.fused",
    "ImageDecoder": "irbis.ml.image",
    "ImageFeaturizer": "irbis.ml.image_featurizer",
    "ImageLIME": "irbis.ml.lime",
    "ImageSetAugmenter": "irbis.ml.image",
    "ImageTransformer": "irbis.ml.image",
    "Lambda": "irbis.ml.basic",
    "ONNXModel": "irbis.ml.onnx_model",
    "RenameColumn": "irbis.ml.basic",
    "Repartition": "irbis.ml.basic",
    "SelectColumns": "irbis.ml.basic",
    "TabularLIME": "irbis.ml.lime",
    "TabularLIMEModel": "irbis.ml.lime",
    "TextClassifier": "irbis.ml.text_classifier",
    "TextClassifierModel": "irbis.ml.text_network",
    "TextEmbedder": "irbis.ml.text_network",
    "TextFeaturizer": "irbis.ml.text",
    "TextLIME": "irbis.ml.lime",
    "TextFeaturizerModel": "irbis.ml.text",
    "TextTokenizer": "irbis.ml.text_network",
    "TorchEstimator": "irbis.ml.estimator",
    "ImageClassifier": "irbis.ml.image_classifier",
    "ImageClassifierModel": "irbis.ml.image_classifier_model",
    "TorchModel": "irbis.ml.torch_model",
    "UnrollImage": "irbis.ml.image",
    "fuse": "irbis.ml.fused",
    "load_local": "irbis.ml.kernel_pipeline",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
