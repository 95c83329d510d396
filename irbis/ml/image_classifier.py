"""Fine-tuning a pretrained network on a DataFrame's images, and scoring images with the result.

:class:`ImageClassifier` is one estimator for the whole job: a catalogue backbone (EfficientNet-Lite0, the
ResNets, or a registered model) with its pretrained weights and a new head, trained on the images of a
DataFrame (Spark image structs, or the bytes of image files) through :class:`~irbis.ml.TorchEstimator`,
so every strategy, checkpointing, validation, class weights and early stopping apply. The images are
streamed and decoded in the workers, through the model's one preprocessing and the training-time
augmentation of :mod:`irbis.kernels.image_augment`.

:class:`ImageClassifierModel` scores images through the fast inference path of
:class:`~irbis.ml.ImageFeaturizer` (decoding, preprocessing and the network in one Arrow batch, the network
exported once per machine, ``engine`` and ``precision``) and writes ``rawPrediction``, ``probability``
and ``prediction`` as Spark ML classifiers do.
"""
from __future__ import annotations

import json
from functools import partial
from typing import Any

from pyspark import keyword_only
from pyspark.ml.param import TypeConverters

from irbis.ml.base import IrbisEstimator
from irbis.ml.estimator import TRAIN_PARAMS, TorchEstimator
from irbis.ml.image_classifier_model import ImageClassifierModel
from irbis.ml.params import HasDevice, Row, at_least, in_registry, table_mixin
from irbis.models import MODELS

__all__ = ["ImageClassifier", "ImageClassifierModel"]

#: The TorchEstimator Params ImageClassifier shares, with their docs and checks (one source of truth).
_SHARED = ("labelCol", "predictionCol", "optimizer", "learningRate", "momentum", "learningRateSchedule",
           "batchSize", "epochs", "numWorkers", "strategy", "strategyOptions", "validationFraction",
           "checkpointDir", "checkpointInterval", "seed", "showProgress", "nanPolicy", "shuffleBuffer",
           "classWeights", "earlyStoppingPatience", "augmentation", "recomputeBatchNorm", "lrScaling",
           "referenceBatchSize", "warmupEpochs", "mlflowRun")
_DEFAULTS = {"optimizer": "adam", "learningRate": 1e-3, "batchSize": 16, "epochs": 5,
             "augmentation": json.dumps([{"op": "random_resized_crop", "scale": [0.6, 1.0]},
                                         {"op": "flip", "flip_code": 1, "p": 0.5},
                                         {"op": "color_jitter", "brightness": 0.2, "contrast": 0.2, "p": 0.5}])}
_CLASSIFIER_ROWS: list[Row] = [
    (name, doc, conv, _DEFAULTS.get(name, default), *rest)
    for name, doc, conv, default, *rest in TRAIN_PARAMS if name in _SHARED
] + [
    ("inputCol", "image column: Spark image structs (irbis.read_images) or the bytes of image files "
                 "(binaryFile's content)", TypeConverters.toString, "image"),
    ("backbone", "the pretrained network: a catalogue model (irbis.models.MODELS) with a preprocessing record",
     TypeConverters.toString, "efficientnet_lite0", in_registry(MODELS)),
    ("numClasses", "number of classes (labels 0..numClasses-1)", TypeConverters.toInt, None, at_least(2)),
    ("freezeUntil", "train only the layers after this named layer (a named_modules() name); empty: every layer",
     TypeConverters.toString, ""),
    ("backboneLearningRateFactor", "the backbone's learning rate as a share of learningRate (the new head gets "
                                   "learningRate)", TypeConverters.toFloat, 0.1, at_least(0)),
    ("dropout", "dropout before the new head, where the backbone has one (EfficientNet-Lite0)",
     TypeConverters.toFloat, 0.2, at_least(0)),
    ("rawPredictionCol", "output column of the class scores", TypeConverters.toString, "rawPrediction"),
    ("probabilityCol", "output column of the class probabilities", TypeConverters.toString, "probability"),
]


class ImageClassifier(IrbisEstimator, table_mixin("_HasImageClassifierParams", _CLASSIFIER_ROWS, (HasDevice,))):
    """Fine-tune a pretrained catalogue network on the images of a DataFrame.

    The backbone keeps its pretrained weights and gets a new ``numClasses`` head; ``freezeUntil`` freezes
    the layers up to a named one (their BatchNorm statistics too), and the backbone trains at
    ``backboneLearningRateFactor`` times the head's rate. The images are decoded and preprocessed as the
    backbone's catalogue card says, in the workers, and augmented (``augmentation``) per row and epoch
    from ``seed``. Training runs through :class:`~irbis.ml.TorchEstimator`: ``strategy`` and
    ``numWorkers`` pick the data-parallel strategy, ``checkpointDir`` resumes after a lost worker,
    ``validationFraction`` adds per-epoch validation loss, accuracy and (two classes) ROC AUC to
    ``training_summary``, ``earlyStoppingPatience`` stops and keeps the best epoch, ``classWeights``
    weighs rare classes. The names follow SynapseML's ``DeepVisionClassifier`` where they meet
    (``backbone``, ``numClasses``, ``batchSize``, ``epochs``, ``learningRate``, ``labelCol``; ``imageCol``
    is accepted for ``inputCol``).

    Examples
    --------
    >>> clf = ImageClassifier(backbone="efficientnet_lite0", imageCol="image", numClasses=2)
    >>> clf.getInputCol(), clf.getBackbone(), clf.getBatchSize()
    ('image', 'efficientnet_lite0', 16)

    .. code-block:: python

        model = ImageClassifier(numClasses=2, epochs=3).fit(images_with_labels)
        model.transform(test).select("probability", "prediction")
    """

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._set(**self._aliased(self._input_kwargs))

    @keyword_only
    def setParams(self, **kwargs: Any) -> ImageClassifier:
        """Set Params by keyword (``imageCol`` is ``inputCol``)."""
        return self._set(**self._aliased(self._input_kwargs))

    @staticmethod
    def _aliased(kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(kwargs)
        if "imageCol" in kwargs:
            kwargs["inputCol"] = kwargs.pop("imageCol")
        return kwargs

    def setImageCol(self, value: str) -> ImageClassifier:
        """Sets inputCol (SynapseML's name)."""
        return self._set(inputCol=value)

    def getImageCol(self) -> str:
        """Gets inputCol (SynapseML's name)."""
        return self.getInputCol()

    def _estimator(self) -> TorchEstimator:
        """The TorchEstimator that trains the network, with this stage's Params."""
        from irbis.train.finetune import finetune_network, freeze_until, head_architecture, head_name

        if not self.isDefined(self.numClasses):
            raise ValueError("ImageClassifier: set numClasses (the labels are 0..numClasses-1)")
        backbone, classes, freeze = self.getBackbone(), self.getNumClasses(), self.getFreezeUntil()
        layers = _meta_network(backbone)
        if freeze:  # a name that is no layer is refused before any job starts
            freeze_until(layers, freeze)
        factory = partial(finetune_network, backbone, classes, freeze, self.getSeed(), True, self.getDropout())
        est = TorchEstimator(network=factory, featuresCol=self.getInputCol(), imagePreprocessing=backbone,
                             device=self.getDevice(), **{n: self.getOrDefault(n) for n in _SHARED
                                                         if self.isDefined(getattr(self, n))})
        est._lr_factors = {head_name(layers): 1.0, "": self.getBackboneLearningRateFactor()}
        est._architecture = head_architecture(backbone, classes)
        est._classes_param = "numClasses"  # labels outside [0, numClasses) are named by the workers' checks
        return est

    def _fit(self, dataset: Any) -> ImageClassifierModel:
        est = self._estimator()
        if self.getLabelCol() not in dataset.columns:
            raise ValueError(f"ImageClassifier: labelCol {self.getLabelCol()!r} is not a column; columns: "
                             f"{dataset.columns}")
        model = est.fit(dataset)
        model._set(model=self.getBackbone(), rawPredictionCol=self.getRawPredictionCol(),
                   probabilityCol=self.getProbabilityCol())
        self.last_estimator = est
        return model


def _meta_network(backbone: str) -> Any:
    """The backbone's architecture built on the meta device (no weights), to find its layers by name."""
    import torch

    from irbis.models import get_entry

    with torch.device("meta"):
        return get_entry(backbone).build()
