"""Irbis's vocabulary: each concept a user meets on the stages, its one Param name, and what it means.

A stage that has a concept of this table names its Param as the table does, so that a user who learned
one stage can guess the Params of every other (the stages to come included). The other names of a
concept (``avoid``) are never the name of an Irbis Param; SynapseML's names are SynapseML aliases
(:mod:`irbis.ml.synapseml`), which are methods, not Params.

The classifier outputs mean what Spark ML's classifiers write: ``rawPredictionCol`` the scores
(a vector), ``probabilityCol`` the class probabilities (a vector summing to 1), ``predictionCol``
the predicted class index (a double, the argmax of both).

The documentation page ``docs/vocabulary.md`` is :func:`irbis.ml._docgen.vocabulary_page`'s text
(``python -m irbis.ml._docgen vocabulary`` prints it); a test keeps the two equal, and the conformance
tests check every stage against the table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Term", "VOCABULARY", "CLASSIFIER_OUTPUTS", "term", "avoided_names"]


@dataclass(frozen=True)
class Term:
    """One concept: its Param ``name``, what it means, and the names it must not go by (``avoid``)."""

    concept: str
    name: str
    meaning: str
    avoid: tuple[str, ...] = ()


VOCABULARY: tuple[Term, ...] = (
    Term("the network", "network",
         "the network the stage runs or trains whole: a catalogue name (irbis.models.MODELS, or "
         "irbis.models.text_networks.TEXT_MODELS for text stages), a model folder or file (for text, a Hugging "
         "Face-format folder), or (on an estimator) a module factory",
         ("modelPath", "model", "modelLocation", "networkPath", "modelName")),
    Term("the pretrained trunk", "backbone",
         "the catalogue model whose layers a classifier estimator keeps and puts a new head on (and whose "
         "preprocessing its images get)", ("baseModel", "trunk", "pretrainedModel")),
    Term("input column", "inputCol",
         "the one column a stage reads (estimators too: the column its fitted model reads)",
         ("featuresCol", "inputColumn", "imageCol", "textCol")),
    Term("input columns", "inputCols", "the columns a stage that reads several reads, in order",
         ("inputColumns", "featureCols")),
    Term("output column", "outputCol", "the column a transformer writes", ("outputColumn", "outCol")),
    Term("output form", "outputFormat",
         "how an array-valued output is written: vector (a Spark ML vector), array (array<float>), or, for "
         "image stages, image (an image struct)", ("outputType",)),
    Term("rows per call", "miniBatchSize",
         "rows the network runs on in one forward pass when a stage scores (a kernel call)",
         ("inferenceBatchSize", "scoringBatchSize")),
    Term("rows per training step", "batchSize",
         "rows per optimiser step on each training worker (an estimator)", ("trainBatchSize",)),
    Term("tokens per text", "maxLength",
         "the most tokens of one text that a text stage gives its network, special tokens included (0: the "
         "network's own maximum)", ("maxTokenLen", "maxSeqLength", "maxSequenceLength", "maxTokens")),
    Term("tokens per call", "tokenBudget",
         "the most padded tokens (rows x padded length) in one forward pass of a network over sequences (a "
         "text stage, or TorchModel and ONNXModel with variableLength); rows are sorted by length and cut by it",
         ("tokensPerBatch", "maxBatchTokens")),
    Term("sequences of varying length", "variableLength",
         "the input column of TorchModel or ONNXModel holds sequences whose length varies per row (array<int> "
         "token ids, or array<array<float>> steps x features), padded per batch with a mask",
         ("ragged", "dynamicLength", "variableLengthInput")),
    Term("image preprocessing", "imagePreprocessing",
         "how images become a network's input (resize, centre crop, colour order, mean/std): a catalogue model "
         "whose record they get, or the record as JSON; the same value on an estimator and on its fitted model",
         ("preprocessing", "imageTransform")),
    Term("engine", "engine", "what runs the network: auto, torch, onnxruntime or openvino",
         ("backend", "runtime", "executionProvider")),
    Term("precision", "precision", "numeric precision of the network's run: fp32, bf16 or int8",
         ("dtype", "computeDtype", "quantization")),
    Term("training arithmetic", "trainingPrecision",
         "the arithmetic of an estimator's training steps: fp32, bf16 (autocast; weights, gradients and "
         "optimiser in fp32) or auto (bf16 for images on a GPU); precision is the fitted network's run",
         ("mixedPrecision", "amp", "autocast", "trainPrecision")),
    Term("device", "device", "where the network runs: cpu, cuda or auto", ("deviceType", "gpu", "useGpu")),
    Term("error column", "errorCol",
         "a column for the reason a row gave a null output (empty: the first bad row fails the job)",
         ("errorColumn", "errCol", "ignoreDecodingErrors")),
    Term("classifier scores", "rawPredictionCol",
         "a classifier's raw scores (logits), one per class, as a vector (as Spark ML's classifiers)",
         ("scoresCol", "logitsCol")),
    Term("classifier probabilities", "probabilityCol",
         "a classifier's class probabilities, a vector summing to 1 (as Spark ML's classifiers)",
         ("probCol", "probabilitiesCol")),
    Term("classifier prediction", "predictionCol",
         "a classifier's predicted class index, a double: the argmax of rawPredictionCol and of "
         "probabilityCol (as Spark ML's classifiers)", ("labelOutputCol", "predictedCol")),
)

#: The three outputs that mean what Spark ML's classifiers write, when a stage has all three.
CLASSIFIER_OUTPUTS = ("rawPredictionCol", "probabilityCol", "predictionCol")


def term(name: str) -> Term:
    """The vocabulary's entry for the Param ``name`` (KeyError when it names no concept of the table)."""
    for entry in VOCABULARY:
        if entry.name == name:
            return entry
    raise KeyError(name)


def avoided_names() -> dict[str, str]:
    """Each name to avoid -> the vocabulary's name of its concept."""
    return {bad: entry.name for entry in VOCABULARY for bad in entry.avoid}
