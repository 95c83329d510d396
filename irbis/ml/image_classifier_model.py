"""``ImageClassifierModel``: images to class scores, probabilities and the predicted class.

It scores images through the fast inference path of :class:`~irbis.ml.ImageFeaturizer` (decoding,
preprocessing and the network in one Arrow batch, the network exported once per machine, ``engine`` and
``precision``) and writes ``rawPrediction``, ``probability`` and ``prediction`` as Spark ML classifiers
do. :class:`~irbis.ml.ImageClassifier` fits one.
"""
from __future__ import annotations

import json
from typing import Any

from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.sql.types import DataType, DoubleType, StringType

from irbis.kernels.blocks import BatchFn
from irbis.ml.aliases import alias_mixin
from irbis.ml.base import IrbisModel
from irbis.ml.image_network import ImageNetworkStage
from irbis.ml.params import Row, check_preprocessing, table_mixin
from irbis.ml.persistence import load_network_files, save_network_files
from irbis.ml.synapseml import IMAGE_FEATURIZER_ALIASES
from irbis.models import MODELS
from irbis.train.progress import SummaryAttribute

__all__ = ["ImageClassifierModel"]

_PREDICTION_ROWS: list[Row] = [
    ("rawPredictionCol", "column of the network's class scores (logits), a vector", TypeConverters.toString,
     "rawPrediction"),
    ("probabilityCol", "column of the class probabilities (softmax of the scores), a vector",
     TypeConverters.toString, "probability"),
    ("predictionCol", "column of the predicted class index (double)", TypeConverters.toString, "prediction"),
    ("imagePreprocessing", "how the images become the network's input: a catalogue model or its JSON "
     "preprocessing record (empty: the catalogue entry backbone's)", TypeConverters.toString, "",
     check_preprocessing),
    ("network", "the fine-tuned network: a model folder or file, saved with the stage", TypeConverters.toString, ""),
    ("backbone", "the catalogue model the network was fine-tuned from (its preprocessing, unless imagePreprocessing "
     "is set)", TypeConverters.toString, "efficientnet_lite0"),
]


#: ImageFeaturizer's SynapseML name of errorCol (its other names are of layers this stage does not have).
_ClassifierModelNames: Any = alias_mixin("_ClassifierModelNames",
                                    [a for a in IMAGE_FEATURIZER_ALIASES if a.target == "errorCol"])


_ClassifierModelParams: Any = table_mixin("_ClassifierModelParams", _PREDICTION_ROWS)


class ImageClassifierModel(_ClassifierModelNames, ImageNetworkStage, _ClassifierModelParams, IrbisModel):
    """Images to class scores, probabilities and the predicted class, with a fine-tuned network.

    Made by :class:`ImageClassifier`; ``training_summary`` holds the per-epoch records of that fit. It reads
    the same inputs as :class:`~irbis.ml.ImageFeaturizer` and runs the network the same way (both are
    :class:`~irbis.ml.image_network.ImageNetworkStage`: ``engine``, ``precision``, ``device``,
    ``miniBatchSize``, ``errorCol``, ``maxPixels``, ``fastDecode``), but has none of its layer Params: it
    writes the network's output as Spark ML's classifiers do. ``network`` is the fine-tuned network (a model folder or
    file, saved with the stage), ``backbone`` the catalogue model it was fine-tuned from, and
    ``imagePreprocessing`` the record its images get (empty: the catalogue entry ``backbone``'s).
    """

    _extras = ("images",)

    #: The fit's per-epoch records, a list of dicts that shows as a table in a notebook (TrainingSummary).
    training_summary = SummaryAttribute()

    #: Not ImageFeaturizer's catalogue name: the network this model runs is its own, fine-tuned one.

    _defaults = {"inputCol": "image", "errorCol": ""}

    def _init_state(self) -> None:
        self.training_summary = None

    def _check_params(self) -> None:
        self._check_layers()

    @classmethod
    def from_module(cls, module: Any, preprocessing: dict[str, Any], *, architecture: dict[str, Any] | None = None,
                    **params: Any) -> ImageClassifierModel:
        """Wrap an in-memory network trained on images preprocessed as ``preprocessing`` (a record's dict);
        its files go to the Irbis cache as :meth:`irbis.ml.TorchModel.from_module` writes them."""
        from irbis.ml.torch_model import TorchModel

        arch = architecture or {}
        files = TorchModel.from_module(module, inputShape=[len(preprocessing["mean"]), *preprocessing["input_size"]],
                                       **({"architecture": arch["architecture"], "options": arch["options"]}
                                          if arch else {}))
        return cls(network=files.getNetwork(), imagePreprocessing=json.dumps(preprocessing), **params)

    def setNetwork(self, value: str) -> ImageClassifierModel:  # noqa: N802
        """Sets network: the fine-tuned network (a model folder or file)."""
        return self._set(network=value)

    # -- what ImageNetworkStage asks ------------------------------------------------------------------
    def _preprocessing(self) -> Any:
        from irbis.models import preprocessing_for

        return preprocessing_for(self.getImagePreprocessing() or self.getBackbone())

    def _check_layers(self) -> None:
        if self.getImagePreprocessing():
            self._preprocessing()
        elif self.getBackbone() not in MODELS:
            raise ValueError(f"ImageClassifierModel: backbone {self.getBackbone()!r} is not in the catalogue; set "
                             "imagePreprocessing")

    def layer_columns(self) -> list[tuple[str, str]]:
        return [("", self.getOrDefault(self.rawPredictionCol))]

    def _source(self) -> dict[str, Any]:
        from irbis.kernels.inference import resolve_source

        path = self.getNetwork()
        if not path:
            raise ValueError("ImageClassifierModel: network is empty; fit an ImageClassifier, or set network")
        return resolve_source(path)

    def _output_columns(self) -> list[tuple[str, DataType]]:
        err = self.getErrorCol()
        return [(self.getOrDefault(self.rawPredictionCol), VectorUDT()),
                (self.getOrDefault(self.probabilityCol), VectorUDT()),
                (self.getPredictionCol(), DoubleType())] + ([(err, StringType())] if err else [])

    def _make_batch_fn(self) -> BatchFn:
        return self._kernel((self.getOrDefault(self.probabilityCol), self.getPredictionCol()))

    # -- persistence: the network's files and the training summary -----------------------------------
    def _has_extra(self) -> bool:
        return True

    def _save_extra(self, path: str) -> None:
        save_network_files(self._source(), path, self.training_summary)
        self._save_calibration(path)

    def _load_extra(self, path: str) -> None:
        network, self.training_summary = load_network_files(path)
        if network is not None:
            self._set(network=network)
        self._load_calibration(path)
