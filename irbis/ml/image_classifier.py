"""Fine-tuning a pretrained network on a DataFrame's images, and scoring images with the result.

:class:`ImageClassifier` is one estimator for the whole job: a catalogue backbone (EfficientNet-Lite0, the
ResNets, or a registered model) with its pretrained weights and a new head, trained on the images of a
DataFrame (Spark image structs, or the bytes of image files) through :class:`~irbis.ml.TorchEstimator`,
so every strategy, checkpointing, validation, class weights and early stopping apply. The images are
streamed and decoded in the workers, through the model's one preprocessing and the training-time
augmentation of :mod:`irbis.kernels.image.augment`.

:class:`ImageClassifierModel` scores images through the fast inference path of
:class:`~irbis.ml.ImageFeaturizer` (decoding, preprocessing and the network in one Arrow batch, the network
exported once per machine, ``engine`` and ``precision``) and writes ``rawPrediction``, ``probability``
and ``prediction`` as Spark ML classifiers do.
"""
from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

from pyspark.ml.param import TypeConverters

from irbis.ml.base import IrbisEstimator
from irbis.ml.estimator import TRAIN_PARAMS, TorchEstimator
from irbis.ml.image_classifier_model import ImageClassifierModel
from irbis.ml.params import HasDevice, Row, at_least, in_registry, one_of, rows_named, table_mixin
from irbis.ml.tracking import fit_is_tracked, log_fit
from irbis.models import MODELS

__all__ = ["ImageClassifier", "ImageClassifierModel"]

_log = logging.getLogger(__name__)

#: The TorchEstimator Params ImageClassifier shares, with their docs and checks (one source of truth).
_SHARED = ("labelCol", "predictionCol", "optimizer", "learningRate", "momentum", "learningRateSchedule",
           "batchSize", "epochs", "numWorkers", "strategy", "strategyOptions", "validationFraction",
           "checkpointDir", "checkpointInterval", "seed", "showProgress", "nanPolicy", "shuffleBuffer", "feedProcesses",
           "classWeights", "earlyStoppingPatience", "augmentation", "recomputeBatchNorm", "lrScaling",
           "referenceBatchSize", "warmupEpochs", "mlflowRun", "autoBatchSizes", "autoBatchEvery",
           "autoBatchTolerance", "engine", "precision", "trainingPrecision")
_CLASSIFIER_ROWS: list[Row] = rows_named(_SHARED, TRAIN_PARAMS) + [
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
    ("cacheFrozen", "'auto': when freezeUntil is set, augmentation is '[]' (fixed copies, as ImageSetAugmenter "
                    "makes them, are rows like any other) and the network cuts there, the frozen layers run once "
                    "per image, on the inference engine (ImageFeaturizer's path), and the epochs train the layers "
                    "after them on that output; 'never': every epoch runs the whole network",
     TypeConverters.toString, "auto", one_of("auto", "never")),
    ("rawPredictionCol", "output column of the class scores", TypeConverters.toString, "rawPrediction"),
    ("probabilityCol", "output column of the class probabilities", TypeConverters.toString, "probability"),
]


_HasImageClassifierParams: Any = table_mixin("_HasImageClassifierParams", _CLASSIFIER_ROWS, (HasDevice,))


class ImageClassifier(IrbisEstimator, _HasImageClassifierParams):
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

    _extras = ("images",)

    _defaults = {"batchSize": 16, "epochs": 5,
                 "augmentation": json.dumps([{"op": "random_resized_crop", "scale": [0.6, 1.0]},
                                             {"op": "flip", "flip_code": 1, "p": 0.5},
                                             {"op": "color_jitter", "brightness": 0.2, "contrast": 0.2, "p": 0.5}])}
    _extra_keywords = ("imageCol",)

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if "imageCol" in kwargs:  # SynapseML's name of inputCol
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
        from irbis.train.finetune import finetune_network, freeze_until, head_name

        if not self.isDefined(self.numClasses):
            raise ValueError("ImageClassifier: set numClasses (the labels are 0..numClasses-1)")
        backbone, classes, freeze = self.getBackbone(), self.getNumClasses(), self.getFreezeUntil()
        layers = _meta_network(backbone)
        if freeze:  # a name that is no layer is refused before any job starts
            freeze_until(layers, freeze)
        factory = partial(finetune_network, backbone, classes, freeze, self.getSeed(), True, self.getDropout())
        est = TorchEstimator(network=factory, inputCol=self.getInputCol(), imagePreprocessing=backbone,
                             device=self.getDevice(), **{n: self.getOrDefault(n) for n in _SHARED
                                                         if self.isDefined(getattr(self, n))})
        return est.fine_tune({head_name(layers): 1.0, "": self.getBackboneLearningRateFactor()}, "numClasses")

    _model_class = ImageClassifierModel

    def _fit(self, dataset: Any) -> ImageClassifierModel:
        est = self._estimator()
        if self.getLabelCol() not in dataset.columns:
            raise ValueError(f"ImageClassifier: labelCol {self.getLabelCol()!r} is not a column; columns: "
                             f"{dataset.columns}")
        net = self._frozen_network()
        if net is not None:
            model = self._fit_after_frozen(est, dataset, net)
        else:
            _, net, results = est.train_job(dataset)
            model = self._fitted(net, results)
        self.last_estimator = est
        if fit_is_tracked(self):
            log_fit(self, model.training_summary)
        return model

    def _fitted(self, net: Any, results: list[Any], strict: bool = True) -> ImageClassifierModel:
        """The ImageClassifierModel of ``net`` (the whole network) with the trained weights of rank 0's
        result (``strict=False``: only the layers trained, the frozen ones kept as they are)."""
        import io

        import torch

        from irbis.models import get_entry
        from irbis.train.finetune import head_architecture

        backbone = self.getBackbone()
        trained = torch.load(io.BytesIO(results[0].state), weights_only=True)
        unexpected = net.load_state_dict(trained, strict=strict).unexpected_keys
        if unexpected:
            raise RuntimeError(f"ImageClassifier: the trained layers do not fit {backbone}: {unexpected}")
        model = ImageClassifierModel.from_module(
            net.eval(), get_entry(backbone).preprocessing.to_dict(),
            architecture=head_architecture(backbone, self.getNumClasses()), backbone=backbone,
            inputCol=self.getInputCol(), predictionCol=self.getPredictionCol(),
            rawPredictionCol=self.getRawPredictionCol(), probabilityCol=self.getProbabilityCol(),
            device=self.getDevice(), engine=self.getEngine(), precision=self.getPrecision())
        model.training_summary = results[0].history
        return model

    def _frozen_network(self) -> Any:
        """The network, built on the CPU without its weights, when the frozen layers can run once per image
        (cacheFrozen), else None: only to learn that it cuts at freezeUntil and the shape at the cut."""
        from irbis.train.finetune import finetune_network, frozen_suffix

        freeze = self.getFreezeUntil()
        if self.getCacheFrozen() == "never" or not freeze or json.loads(self.getAugmentation() or "[]"):
            return None
        net = finetune_network(self.getBackbone(), self.getNumClasses(), freeze, self.getSeed(), False,
                               self.getDropout())
        suffix, why = frozen_suffix(net, freeze)
        if suffix is None:
            _log.info("ImageClassifier: every epoch runs the whole network: %s", why)
            return None
        return net

    def _fit_after_frozen(self, est: TorchEstimator, dataset: Any, net: Any) -> Any:
        """Fit the layers after freezeUntil on the frozen layers' output, computed once per image by
        ImageFeaturizer's inference path; the model returned scores images with the whole network."""
        from irbis.ml.image_featurizer import ImageFeaturizer
        from irbis.models import get_entry, layer_output_shapes
        from irbis.spark.columns import column
        from irbis.train.finetune import finetune_network, finetune_suffix

        backbone, classes, freeze = self.getBackbone(), self.getNumClasses(), self.getFreezeUntil()
        # the shape from one image through ``net`` on the CPU (a first forward on the meta device costs more:
        # it sets up the meta kernels)
        preprocessing = get_entry(backbone).preprocessing
        shapes = layer_output_shapes(net.eval(), [freeze], (len(preprocessing.mean), *preprocessing.input_size))
        shape = [int(d) for d in shapes[freeze]]
        frozen = f"{self.getInputCol()}_frozen"
        featurizer = ImageFeaturizer(network=backbone, inputCol=self.getInputCol(), outputLayer=freeze,
                                     outputCol=frozen, device=self.getDevice())
        rows = featurizer.transform(dataset.select(column(self.getInputCol()), column(self.getLabelCol())))
        rows = rows.where(column(frozen).isNotNull()) if est.getNanPolicy() == "skip" else rows
        est.setParams(network=partial(finetune_suffix, backbone, classes, freeze, self.getSeed(), True,
                                      self.getDropout()),
                      inputCol=frozen, inputShape=shape, augmentation="[]")
        est.clear(est.imagePreprocessing)
        _, _, results = est.train_job(rows, counted=dataset)
        return self._fitted(finetune_network(backbone, classes, freeze, self.getSeed(), True, self.getDropout()),
                            results, strict=False)


def _meta_network(backbone: str) -> Any:
    """The backbone's architecture built on the meta device (no weights), to find its layers by name."""
    import torch

    from irbis.models import get_entry

    with torch.device("meta"):
        return get_entry(backbone).build()
