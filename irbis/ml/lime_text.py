"""``TextLIME``: which words of a text decide a model's prediction (LIME on words; see :mod:`irbis.ml.lime`)."""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np
from pyspark.ml.param import TypeConverters
from pyspark.sql.types import ArrayType, BinaryType, DataType, StringType, StructType

from irbis.explain.lime import explain_text
from irbis.ml.base import IrbisTransformer
from irbis.ml.lime_base import LIMEParams
from irbis.ml.params import in_range, table_mixin

__all__ = ["TextLIME", "explain_texts"]


def explain_texts(block: Any, score: Callable[[np.ndarray], np.ndarray], settings: dict[str, Any]) -> dict[str, Any]:
    """Explain each text of a string block; a null text (or one without words) gets a reason instead."""
    from irbis.kernels.text_encoder import decode_texts

    texts, errors = decode_texts(block, settings["column"], "TextLIME")
    weights: list[Any] = [None] * len(texts)
    fits: list[Any] = [None] * len(texts)
    words: list[Any] = [None] * len(texts)
    reasons: list[Any] = list(errors)
    for i, text in enumerate(texts):
        if text is None:
            continue
        try:
            found = explain_text(text, score, settings["targets"], num_samples=settings["num_samples"],
                                 fraction=settings["fraction"], alpha=settings["alpha"], seed=settings["seed"],
                                 batch_size=settings["batch_size"], target_name=settings["target_col"])
        except ValueError as err:
            if not settings["error"]:
                raise
            reasons[i] = str(err)
            continue
        weights[i], fits[i] = found.weights.tolist(), found.r2.tolist()
        words[i] = [text[a:b] for a, b in found.segments]  # type: ignore[union-attr]  # a text's spans
    if not settings["error"] and any(r and r != "null text" for r in reasons):
        raise ValueError(next(r for r in reasons if r and r != "null text"))
    out = {settings["output"]: weights, settings["metrics"]: fits}
    if settings["tokens"]:
        out[settings["tokens"]] = words
    return {**out, settings["error"]: reasons} if settings["error"] else out


def _texts_block(batch: np.ndarray) -> np.ndarray:
    return np.asarray(batch, dtype=object)


_TEXT_LIME_PARAMS: Any = table_mixin("HasTextLIMEParams", [
    ("samplingFraction", "probability that a word is kept in a sample", TypeConverters.toFloat, 0.7,
     in_range(0, 1, low_open=True)),
    ("tokensCol", "output column of the explained words, one per weight (empty: none)", TypeConverters.toString,
     "tokens"),
])


class TextLIME(LIMEParams, _TEXT_LIME_PARAMS, IrbisTransformer):
    """Explain a model's predictions on texts: a weight per word and target class (LIME).

    Each text's words (runs of word characters) are removed at random (each kept with probability
    ``samplingFraction``) in ``numSamples`` copies, which are scored through the model's batch kernels
    ``miniBatchSize`` at a time (a text pipeline: :class:`TextEmbedder` and a classifier, or
    :class:`TextClassifierModel`), and a weighted ridge fit of ``targetCol[targetClasses]`` on the on/off
    masks gives each word's weight. ``tokensCol`` names the words, in order.

    Examples
    --------
    >>> lime = TextLIME(model=pipeline, inputCol="review", targetClasses=[1], numSamples=500)   # doctest: +SKIP
    >>> lime.transform(reviews).select("tokens", "weights")                                     # doctest: +SKIP
    """

    _accepts = frozenset({"string"})
    _to_block = staticmethod(_texts_block)

    _defaults = {"inputCol": "text", "outputCol": "weights", "numSamples": 1000}

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        tokens = self.getOrDefault(self.tokensCol)
        cols = self._result_columns()
        return cols[:2] + ([(tokens, ArrayType(StringType()))] if tokens else []) + cols[2:]

    def _validate_schema(self, schema: StructType) -> None:
        found = schema[self.getInputCol()].dataType
        if not isinstance(found, (StringType, BinaryType)):
            raise TypeError(f"TextLIME: input column {self.getInputCol()!r} must hold text (string), found "
                            f"{found.simpleString()}")

    def _settings(self) -> dict[str, Any]:
        return dict(super()._settings(), fraction=self.getOrDefault(self.samplingFraction),
                    tokens=self.getOrDefault(self.tokensCol))

    def _explainer(self) -> Callable[[Any, Callable[[np.ndarray], np.ndarray]], dict[str, Any]]:
        return partial(explain_texts, settings=self._settings())
