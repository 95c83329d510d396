"""Spark ML stages of Irbis (the adapters over the pure kernels).

``__all__`` lists every public stage; the conformance suite (tests/conformance) tests each one.
"""

from irbis.ml.assembler import FastVectorAssembler
from irbis.ml.basic import Cache, DropColumns, Lambda, RenameColumn, Repartition, SelectColumns
from irbis.ml.ensemble import EnsembleByKey
from irbis.ml.estimator import TorchEstimator
from irbis.ml.featurize import Featurize, FeaturizeModel
from irbis.ml.featurizer import ImageFeaturizer
from irbis.ml.fuse import FusedStages, fuse
from irbis.ml.image import ImageDecoder, ImageSetAugmenter, ImageTransformer, UnrollImage
from irbis.ml.lime import ImageLIME, TabularLIME, TabularLIMEModel
from irbis.ml.onnx_model import ONNXModel
from irbis.ml.text import TextFeaturizer, TextFeaturizerModel
from irbis.ml.torch_model import TorchModel

__all__ = [
    "Cache",
    "DropColumns",
    "EnsembleByKey",
    "FastVectorAssembler",
    "Featurize",
    "FeaturizeModel",
    "FusedStages",
    "ImageDecoder",
    "ImageFeaturizer",
    "ImageLIME",
    "ImageSetAugmenter",
    "ImageTransformer",
    "Lambda",
    "ONNXModel",
    "RenameColumn",
    "Repartition",
    "SelectColumns",
    "TabularLIME",
    "TabularLIMEModel",
    "TextFeaturizer",
    "TextFeaturizerModel",
    "TorchEstimator",
    "TorchModel",
    "UnrollImage",
    "fuse",
]

