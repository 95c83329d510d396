"""Fine-tuning a pretrained text encoder on a DataFrame's texts: ``TextClassifier`` → ``TextClassifierModel``.

:class:`TextClassifier` is to texts what :class:`~irbis.ml.ImageClassifier` is to images: one estimator for
the whole job. The backbone is a text encoder (the catalogue's sentence encoder, or a Hugging Face-format
encoder folder) with its pretrained weights, given a new ``numClasses`` head (:mod:`irbis.train.text_finetune`).
The texts are tokenized in the Spark workers with the backbone's own tokenizer (:class:`~irbis.ml.TextTokenizer`)
and trained on through :class:`~irbis.ml.TorchEstimator` as variable-length token-id rows, in length-bucketed
batches under ``tokenBudget``: every strategy, checkpoints and resume, validation metrics, class weights and
early stopping apply. The fitted model is a :class:`~irbis.ml.TextClassifierModel` over the trained network
written as a Hugging Face-format classifier folder, so it scores, serves, explains and logs to MLflow as any
text classifier does.
"""

from __future__ import annotations

import io
import logging
import tempfile
from pathlib import Path
from typing import Any

from pyspark.ml.param import TypeConverters

from irbis.ml.aliases import alias_mixin
from irbis.ml.base import IrbisEstimator
from irbis.ml.estimator import TRAIN_PARAMS, TorchEstimator
from irbis.ml.image_classifier import _CLASSIFIER_ROWS
from irbis.ml.image_classifier import _SHARED as _IMAGE_SHARED
from irbis.ml.params import SHARED_PARAMS, HasDevice, Row, in_range, rows_named, table_mixin
from irbis.ml.synapseml import TEXT_CLASSIFIER_ALIASES
from irbis.ml.text_network import _TEXT_ROWS, TextClassifierModel, TextTokenizer
from irbis.ml.tracking import fit_is_tracked, log_fit

__all__ = ["TextClassifier", "TextClassifierModel"]

_log = logging.getLogger(__name__)

#: The TorchEstimator Params TextClassifier shares with ImageClassifier (the image-only ones left out).
_SHARED = tuple(n for n in _IMAGE_SHARED if n not in ("augmentation", "recomputeBatchNorm"))
#: ImageClassifier's rows that mean the same here.
_SAME_AS_IMAGES = ("numClasses", "freezeUntil", "backboneLearningRateFactor", "rawPredictionCol", "probabilityCol")


def _check_backbone(name: str, value: Any) -> None:
    from irbis.errors import ParamValueError
    from irbis.models.text_networks import TextModelError, text_card

    try:
        card = text_card(value)
    except TextModelError as err:
        raise ParamValueError(name, value, str(err)) from None
    if card.task != "embedding":
        raise ParamValueError(name, value, "a text encoder (a sentence encoder or a Hugging Face encoder folder); "
                                           f"{value!r} is a sequence classifier already")


_check_backbone.allowed = ("a text encoder of the catalogue or a Hugging Face-format encoder folder",)  # type: ignore[attr-defined]

_TEXT_CLASSIFIER_ROWS: list[Row] = (rows_named(_SHARED, TRAIN_PARAMS) + rows_named(_SAME_AS_IMAGES, _CLASSIFIER_ROWS)
                                   + rows_named(("maxLength", "tokenBudget"), _TEXT_ROWS, SHARED_PARAMS)) + [
    ("inputCol", "text column (string, or UTF-8 bytes as binary)", TypeConverters.toString, "text"),
    ("backbone", "the pretrained text encoder: a text network of the catalogue "
                 "(irbis.models.text_networks.TEXT_MODELS) or a Hugging Face-format encoder folder (config.json, "
                 "model.safetensors, tokenizer.json)",
     TypeConverters.toString, "all_minilm_l6_v2", _check_backbone),
    ("dropout", "dropout before the new head (the architecture's classifier_dropout)", TypeConverters.toFloat, 0.1,
     in_range(0, 1, high_open=True)),
]

_HasTextClassifierParams: Any = table_mixin("_HasTextClassifierParams", _TEXT_CLASSIFIER_ROWS, (HasDevice,))


TextClassifierNames: Any = alias_mixin("TextClassifierNames", TEXT_CLASSIFIER_ALIASES)


class TextClassifier(TextClassifierNames, IrbisEstimator,
                     _HasTextClassifierParams):
    """Fine-tune a pretrained text encoder on the texts of a DataFrame.

    The encoder keeps its pretrained weights and gets a new ``numClasses`` head (its architecture's
    ``...ForSequenceClassification``: the pooler, dropout and a linear layer); the encoder trains at
    ``backboneLearningRateFactor`` times the head's ``learningRate`` and ``freezeUntil`` freezes it up to a
    named layer (e.g. ``model.bert.encoder.layer.3``). Texts are tokenized in the workers, truncated at
    ``maxLength`` tokens (0: the encoder's maximum), and batched by length under ``tokenBudget`` padded
    tokens (``batchSize`` texts at most), the batches' order shuffled per worker and epoch from ``seed``; the
    fitted model scores under the text stages' own default budget (set its ``tokenBudget`` to change it).
    ``strategy`` and ``numWorkers`` pick the data-parallel strategy, ``checkpointDir`` resumes after a lost
    worker, ``validationFraction`` adds per-epoch validation loss and accuracy to ``training_summary``.
    Labels are ``0..numClasses-1``. SynapseML's ``DeepTextClassifier`` names are accepted: ``textCol``,
    ``checkpoint`` (the backbone; nothing is downloaded) and ``maxTokenLen``. ``augment`` (not a Param, not
    saved) is a callable on each batch's token ids before padding, as on :class:`TorchEstimator`.

    Examples
    --------
    >>> clf = TextClassifier(textCol="review", numClasses=2)
    >>> clf.getInputCol(), clf.getBackbone(), clf.getBatchSize(), clf.getEpochs()
    ('review', 'all_minilm_l6_v2', 16, 3)

    .. code-block:: python

        model = TextClassifier(inputCol="review", numClasses=2).fit(reviews)
        model.transform(test).select("probability", "prediction")
    """

    _extras = ("text",)

    # learningRate is TorchEstimator's 1e-3 for the head and the encoder gets 1e-4 (backboneLearningRateFactor
    # 0.1): MiniLM fine-tuned 3 epochs on the drug reviews' sentiment tested at 0.768, against 0.741 at 3e-4
    # (majority class 0.654)
    _defaults = {"batchSize": 16, "epochs": 3}
    _extra_keywords = ("augment",)

    def _init_state(self) -> None:
        self.augment: Any = None

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if "augment" in kwargs:  # a callable on each batch's token ids (not a Param, not saved)
            self.augment = kwargs.pop("augment")
        return super()._keywords(kwargs)

    _model_class = TextClassifierModel

    def _factory(self, source: dict[str, Any], pretrained: bool = True) -> Any:
        from functools import partial

        from irbis.models.text_networks import TEXT_MODELS
        from irbis.spark.files import localize, ship_file
        from irbis.train.text_finetune import TextFinetune

        locate = None
        if source["card"]["name"] not in TEXT_MODELS:
            locate = partial(localize, source["folder"], ship_file(source["folder"]))
        return TextFinetune(source, self.getNumClasses(), self.getFreezeUntil(), self.getSeed(), pretrained,
                            self.getDropout(), locate=locate)

    def _estimator(self, source: dict[str, Any]) -> TorchEstimator:
        """The TorchEstimator that trains the network on the token ids, with this stage's Params."""
        from irbis.train.finetune import freeze_until, head_name

        if not self.isDefined(self.numClasses):
            raise ValueError("TextClassifier: set numClasses (the labels are 0..numClasses-1)")
        import torch

        with torch.device("meta"):  # the layers' names, to check freezeUntil before any job starts
            layers = self._factory(source, pretrained=False)()
        if self.getFreezeUntil():
            freeze_until(layers, self.getFreezeUntil())
        est = TorchEstimator(network=self._factory(source), inputCol=self.getInputCol(), device=self.getDevice(),
                             **{n: self.getOrDefault(n) for n in _SHARED if self.isDefined(getattr(self, n))})
        est.setParams(tokenBudget=self.getTokenBudget(), augment=self.augment)
        return est.fine_tune({head_name(layers): 1.0, "": self.getBackboneLearningRateFactor()}, "numClasses")

    def _fit(self, dataset: Any) -> TextClassifierModel:
        import torch

        from irbis.models import default_cache_dir
        from irbis.models.text_networks import text_source
        from irbis.spark.columns import column
        from irbis.train.text_finetune import write_classifier_folder

        for role, col in (("inputCol", self.getInputCol()), ("labelCol", self.getLabelCol())):
            if col not in dataset.columns:
                raise ValueError(f"TextClassifier: {role} {col!r} is not a column; columns: {dataset.columns}")
        source = text_source(self.getBackbone())
        est = self._estimator(source)
        # the texts' token ids, under the texts' own column name so that the training's messages name it
        text, label, ids = self.getInputCol(), self.getLabelCol(), f"{self.uid}_token_ids"
        tokenizer = TextTokenizer(network=self.getBackbone(), inputCol=text, outputCol=ids,
                                  maxLength=self.getMaxLength())
        rows = tokenizer.transform(dataset.select(column(text), column(label)))
        _, net, results = est.train_job(rows.select(column(ids).alias(text), column(label)))
        net.load_state_dict(torch.load(io.BytesIO(results[0].state), weights_only=True))
        root = default_cache_dir() / "fitted"
        root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="text-classifier-", dir=root))
        max_length = self.getMaxLength() or source["card"]["max_length"]
        write_classifier_folder(net.eval(), source["folder"], folder, max_length)
        model = TextClassifierModel(
            network=str(folder), inputCol=self.getInputCol(), rawPredictionCol=self.getRawPredictionCol(),
            probabilityCol=self.getProbabilityCol(), predictionCol=self.getPredictionCol(),
            maxLength=self.getMaxLength(), engine=self.getEngine(), precision=self.getPrecision(),
            device=self.getDevice())  # tokenBudget: the text stages' scoring default, not the training batches'
        model.training_summary = results[0].history
        self.last_estimator = est
        if fit_is_tracked(self):
            log_fit(self, model.training_summary)
        return model
