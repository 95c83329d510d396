"""Text networks as pipeline stages: ``TextEmbedder``, ``TextClassifierModel`` and ``TextTokenizer``.

Each reads a string column (or UTF-8 bytes), tokenizes it in the worker with the network's own
tokenizer, and runs the network on length-aware batches (:mod:`irbis.kernels.sequences`): within each
Arrow batch the texts are sorted by length, cut into batches of at most ``tokenBudget`` padded tokens
and ``miniBatchSize`` texts, each padded to its own longest, and the outputs put back in the rows' order.

The network is a text network of the catalogue (:data:`irbis.models.text_networks.TEXT_MODELS`) or a Hugging
Face-format folder (``config.json``, safetensors weights, ``tokenizer.json``); a folder is saved beside
the stage's Params and shipped to executors that do not share the driver's disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    StringType,
    StructType,
)

from irbis.kernels.blocks import BatchFn
from irbis.kernels.chain import LengthRule
from irbis.kernels.text_encoder import TEXT_TOKEN_BUDGET, TextKernel, decode_texts
from irbis.ml.aliases import alias_mixin
from irbis.ml.base import IrbisModel, IrbisTransformer
from irbis.ml.calibration_sample import HasCalibrationSample
from irbis.ml.network_params import HasVectorOrArrayFormat
from irbis.ml.params import (
    ColumnSetters,
    HasDevice,
    HasEngine,
    HasErrorCol,
    HasMiniBatchSize,
    HasNetwork,
    HasPrecision,
    HasTokenBudget,
    Row,
    at_least,
    one_of,
    table_mixin,
)
from irbis.ml.synapseml import TEXT_EMBEDDER_ALIASES
from irbis.models.text_networks import DEFAULT_TEXT_MODEL
from irbis.train.progress import SummaryAttribute

__all__ = ["TextClassifierModel", "TextEmbedder", "TextTokenizer"]

_TEXT_ROWS = [
    ("maxLength", "tokens per text, special tokens included (0: the network's own maximum, e.g. 256 for "
     "all_minilm_l6_v2); longer texts are handled as truncation says", TypeConverters.toInt, 0, at_least(0)),
    ("truncation", "a text longer than maxLength: truncate (cut at maxLength, counted) or error (no output "
     "and a reason in errorCol, or a failed batch without errorCol)", TypeConverters.toString, "truncate",
     one_of("truncate", "error")),
]

HasTextParams: Any = table_mixin("HasTextParams", _TEXT_ROWS,
                            (HasNetwork, HasMiniBatchSize, HasEngine, HasPrecision, HasDevice, HasErrorCol,
                             HasTokenBudget))


class _TextStage(ColumnSetters, HasTextParams):
    """What the text stages share: the network, the text column, tokenization and the runner's options."""

    _extras: tuple[str, ...] = ("text",)

    _accepts = frozenset({"string"})
    _defaults = {"network": DEFAULT_TEXT_MODEL, "inputCol": "text", "miniBatchSize": 256, "errorCol": "",
                 "tokenBudget": TEXT_TOKEN_BUDGET}

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _validate_schema(self, schema: StructType) -> None:
        col = self.getInputCol()
        found = schema[col].dataType
        if not isinstance(found, (StringType, BinaryType)):
            raise TypeError(f"{type(self).__name__}: column {col!r} must hold text (string, or UTF-8 bytes as "
                            f"binary), found {found.simpleString()}")
        self._source()

    def _error_columns(self) -> list[tuple[str, DataType]]:
        err = self.getErrorCol()
        return [(err, StringType())] if err else []

    def _source(self) -> dict[str, Any]:
        from irbis.models.text_networks import text_source

        return text_source(self.getNetwork())

    def _card(self) -> Any:
        from irbis.models.text_networks import text_card

        return text_card(self.getNetwork())

    def _runner_options(self) -> dict[str, Any]:
        calibration = {"calibration": self.getCalibrationData()} if self.hasParam("calibrationData") else {}
        return dict(engine=self.getEngine(), precision=self.getPrecision(), device=self.getDevice(),
                    max_length=self.getMaxLength(), truncation=self.getTruncation(),
                    token_budget=self.getTokenBudget(), max_rows=self.getMiniBatchSize(), **calibration)

    def _kernel(self, head: str, outputs: dict[str, str]) -> TextKernel:
        """The stage's kernel (:class:`irbis.kernels.text_encoder.TextKernel`): a value naming the network and
        the runner's options; the Spark runner ships a folder of one's own to the executors."""
        return TextKernel(self.getNetwork(), self._source(), self.getInputCol(), head=head, outputs=outputs,
                          options=self._runner_options(), error_col=self.getErrorCol(), stage=type(self).__name__)

    # -- persistence: a user's folder travels with the stage ----------------------------------------
    def _has_extra(self) -> bool:
        from irbis.models.text_networks import TEXT_MODELS

        return (self.getNetwork() not in TEXT_MODELS or getattr(self, "training_summary", None) is not None
                or (self.hasParam("calibrationData") and bool(self.getCalibrationData())))

    def _save_extra(self, path: str) -> None:
        from irbis.ml.persistence import save_network_files
        from irbis.models.text_networks import TEXT_MODELS

        source = {} if self.getNetwork() in TEXT_MODELS else {"path": self._source()["folder"]}
        save_network_files(source, path, getattr(self, "training_summary", None))
        if isinstance(self, HasCalibrationSample):
            self._save_calibration(path)

    def _load_extra(self, path: str) -> None:
        from irbis.ml.persistence import load_network_files

        network, summary = load_network_files(path)
        if network is not None and Path(network).is_dir():
            self._set(network=network)
        if summary is not None:
            self.training_summary = summary
        if isinstance(self, HasCalibrationSample):
            self._load_calibration(path)

    def _length_rule(self) -> LengthRule | None:
        """Texts measured in the network's tokens (as the runner will batch them) under ``tokenBudget``; a null,
        or bytes that are not UTF-8, count as empty."""
        return LengthRule(self.getInputCol(), self._kernel("tokens", {}).measure, self.getTokenBudget())

    def _calibration_folder(self, block: Any) -> str:
        """A sampled text column block as a calibration folder of texts (int8 on OpenVINO)."""
        from irbis.kernels.calibration import write_texts

        texts, _ = decode_texts(block, self.getInputCol(), type(self).__name__)
        return write_texts([t for t in texts if t is not None])


TextEmbedderAliases: Any = alias_mixin("TextEmbedderAliases", TEXT_EMBEDDER_ALIASES)


class TextEmbedder(_TextStage, HasCalibrationSample, HasVectorOrArrayFormat,
                   TextEmbedderAliases, IrbisTransformer):
    """Embed a text column with a sentence encoder: one vector per text.

    With no network named, the catalogue's ``all_minilm_l6_v2`` (384-d, mean pooling, L2 norm): its
    embeddings equal sentence-transformers' ``encode`` (cosine >= 0.9999). A null text gives a null
    vector (and ``"null text"`` in ``errorCol``); an empty string is a text.

    Parameters
    ----------
    network : str
        A text network of the catalogue or a Hugging Face-format folder of an encoder.
    inputCol, outputCol : str
        The text column (string, or UTF-8 bytes) and the embedding column.
    maxLength, truncation : int, str
        Tokens per text (0: the network's maximum) and what a longer text gets.
    tokenBudget, miniBatchSize : int
        Padded tokens and texts per batch of the network.
    engine, precision, device : str
        As :class:`TorchModel`'s; ``auto`` runs fp32 on OpenVINO on the CPU (eager torch on CUDA), bf16 on
        OpenVINO where the CPU has bf16 instructions, int8 on OpenVINO as NNCF quantises it (else ONNX
        Runtime's dynamic int8) (:data:`irbis.kernels.engines.AUTO_ORDER`).
    calibrationData : str or DataFrame
        For int8 on OpenVINO: the texts that set the activation ranges, a folder of ``.txt`` files or a
        DataFrame with ``inputCol`` (256 texts sampled when set, saved with the stage); empty: paragraphs of
        Python's own documentation. Your own texts keep the answers closer to fp32 (``docs/text.md``).
    errorCol : str
        Column for each row's reason when it has no embedding (empty: none; a bad row fails the batch).
    outputFormat : str
        ``vector`` (Spark ML vector, the default) or ``array`` (array<float>).

    Examples
    --------
    >>> import pandas as pd
    >>> out = TextEmbedder(inputCol="review", outputCol="embedding").transform(
    ...     pd.DataFrame({"review": ["Works well.", None]}))                      # doctest: +SKIP
    >>> out["embedding"][0].shape, out["embedding"][1]                            # doctest: +SKIP
    ((384,), None)
    """

    _defaults = {"outputCol": "embedding"}

    def _output_columns(self) -> list[tuple[str, DataType]]:
        out = VectorUDT() if self.getOutputFormat() == "vector" else ArrayType(FloatType())
        return [(self.getOutputCol(), out)] + self._error_columns()

    def _validate_schema(self, schema: StructType) -> None:
        super()._validate_schema(schema)
        if self._card().task != "embedding":
            raise ValueError(f"TextEmbedder: network {self.getNetwork()!r} is a classifier; use TextClassifierModel")

    def _make_batch_fn(self) -> BatchFn:
        return self._kernel("embedding", {"embedding": self.getOutputCol()})


_OUT_ROWS: list[Row] = [
    ("rawPredictionCol", "column of the logits (empty: none)", TypeConverters.toString, "rawPrediction"),
    ("probabilityCol", "column of the class probabilities (softmax of the logits; empty: none)",
     TypeConverters.toString, "probability"),
    ("predictionCol", "column of the predicted class index, a double (empty: none)", TypeConverters.toString,
     "prediction"),
]


HasClassifierOutputs: Any = table_mixin("HasClassifierOutputs", _OUT_ROWS)


class TextClassifierModel(_TextStage, HasCalibrationSample, HasClassifierOutputs,
                          IrbisModel):
    """Score a text classifier (a Hugging Face ``...ForSequenceClassification`` folder): the columns of a
    SparkML classifier.

    ``rawPredictionCol`` holds the logits, ``probabilityCol`` their softmax and ``predictionCol`` the
    index of the largest (a double, as SparkML's classifiers give); :attr:`labels` names the classes
    (``config.json``'s ``id2label``). Empty column names leave that output out. Fitted by
    :class:`~irbis.ml.TextClassifier`, ``training_summary`` holds the per-epoch records of that fit.
    """

    training_summary = SummaryAttribute()

    def _init_state(self) -> None:
        self.training_summary = None

    @property
    def labels(self) -> list[str]:
        """The class names, by index."""
        return list(self._card().labels)

    def _output_columns(self) -> list[tuple[str, DataType]]:
        cols = [(self.getRawPredictionCol(), VectorUDT()), (self.getProbabilityCol(), VectorUDT()),
                (self.getPredictionCol(), DoubleType())]
        return [(n, t) for n, t in cols if n] + self._error_columns()

    def _validate_schema(self, schema: StructType) -> None:
        super()._validate_schema(schema)
        if self._card().task != "classification":
            raise ValueError(f"TextClassifierModel: network {self.getNetwork()!r} is an encoder, not a sequence "
                             "classifier; use TextEmbedder")

    def _make_batch_fn(self) -> BatchFn:
        return self._kernel("classification", {"raw": self.getRawPredictionCol(),
                                               "probability": self.getProbabilityCol(),
                                               "prediction": self.getPredictionCol()})


class TextTokenizer(_TextStage, IrbisTransformer):
    """Token ids of a text column with a network's tokenizer: ``array<int>`` per text, special tokens
    included, at most ``maxLength``; for feeding a network of one's own (``TorchModel``, training)."""

    _defaults = {"outputCol": "tokens"}

    def _output_columns(self) -> list[tuple[str, DataType]]:
        return [(self.getOutputCol(), ArrayType(IntegerType()))] + self._error_columns()

    def _length_rule(self) -> LengthRule | None:
        return None  # tokenizing alone costs the same by length or not: nothing to group

    def _make_batch_fn(self) -> BatchFn:
        return self._kernel("tokens", {"tokens": self.getOutputCol()})
