"""TextFeaturizer: text to a term-frequency (or TF-IDF) vector in one estimator."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp
from pyspark.ml.feature import IDF, ElementwiseProduct, HashingTF, IDFModel, NGram, RegexTokenizer, StopWordsRemover
from pyspark.ml.linalg import DenseVector, SparseVector, VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasOutputCol
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, StringType, StructType

from irbis.errors import require_columns
from irbis.kernels.text_features import IdfState, TextSteps, apply_idf, fit_idf, text_vectors
from irbis.ml.base import IrbisEstimator, IrbisModel
from irbis.ml.params import Row, at_least, one_of, table_mixin
from irbis.ml.synapseml import TextFeaturizerNames, comma_list
from irbis.spark.columns import column

#: The languages of Spark's default stop word lists (``StopWordsRemover.loadDefaultStopWords``).
STOP_WORDS_LANGUAGES = ("danish", "dutch", "english", "finnish", "french", "german", "hungarian", "italian",
                        "norwegian", "portuguese", "russian", "spanish", "swedish", "turkish")


_TEXT_FEATURIZER_ROWS: list[Row] = [
    ("useTokenizer", "split text with a regex (false: the input holds token arrays)", TypeConverters.toBoolean, True),
    ("tokenizerPattern", "regex of separators (gaps) or tokens", TypeConverters.toString, r"\s+"),
    ("tokenizerGaps", "the pattern matches separators (true) or tokens (false)", TypeConverters.toBoolean, True),
    ("minTokenLength", "shorter tokens are dropped", TypeConverters.toInt, 1, at_least(0)),
    ("toLowercase", "lower-case text before tokenising", TypeConverters.toBoolean, True),
    ("useStopWordsRemover", "remove stop words", TypeConverters.toBoolean, False),
    ("stopWords", "stop words (a list, or a comma-separated string); empty: the default list of stopWordsLanguage",
     comma_list, []),
    ("stopWordsLanguage", "language of the default stop words (e.g. english)", TypeConverters.toString, "english",
     one_of(*STOP_WORDS_LANGUAGES)),
    ("caseSensitiveStopWords", "compare stop words case-sensitively", TypeConverters.toBoolean, False),
    ("useNGram", "replace tokens by their n-grams", TypeConverters.toBoolean, False),
    ("nGramLength", "n of the n-grams (>= 1)", TypeConverters.toInt, 2, at_least(1)),
    ("numFeatures", "size of the hashed term-frequency vector", TypeConverters.toInt, 1 << 18, at_least(1)),
    ("binary", "term presence (1.0) instead of counts", TypeConverters.toBoolean, False),
    ("useIDF", "weight term frequencies by inverse document frequency", TypeConverters.toBoolean, True),
    ("minDocFreq", "terms in fewer documents get IDF weight 0", TypeConverters.toInt, 1, at_least(0)),
]


_TextFeaturizerRows: Any = table_mixin("_TextFeaturizerRows", _TEXT_FEATURIZER_ROWS)


class _TextFeaturizerParams(HasInputCol, HasOutputCol, _TextFeaturizerRows):
    """Params shared by :class:`TextFeaturizer` and :class:`TextFeaturizerModel`."""

    def _check_input(self, schema: StructType) -> None:
        col = self.getInputCol()
        require_columns(type(self).__name__, schema.fieldNames(), [col])
        dtype = schema[col].dataType
        wanted = StringType() if self.getOrDefault("useTokenizer") else ArrayType(StringType())
        if dtype.simpleString() != wanted.simpleString():
            raise TypeError(
                f"{type(self).__name__}: column {col!r} must be {wanted.simpleString()} "
                f"(useTokenizer={self.getOrDefault('useTokenizer')}), found {dtype.simpleString()}"
            )
        if self.getOutputCol() in schema.fieldNames():
            raise ValueError(f"{type(self).__name__}: output column {self.getOutputCol()!r} already exists; "
                             "choose another name")

    def _stop_words(self) -> list[str] | None:
        if not self.getOrDefault("useStopWordsRemover"):
            return None
        return list(self.getOrDefault("stopWords")) or StopWordsRemover.loadDefaultStopWords(
            self.getOrDefault("stopWordsLanguage")
        )

    def _steps(self) -> TextSteps:
        g = self.getOrDefault
        return TextSteps(
            pattern=g("tokenizerPattern"), gaps=g("tokenizerGaps"), min_token_length=g("minTokenLength"),
            to_lowercase=g("toLowercase"),
            stop_words=tuple(self._stop_words() or ()) if g("useStopWordsRemover") else None,
            case_sensitive_stop_words=g("caseSensitiveStopWords"),
            ngram_length=g("nGramLength") if g("useNGram") else None, num_features=g("numFeatures"), binary=g("binary"),
        )

    def _tf_pandas(self, cells: list[Any]) -> Any:
        """Hashed term frequencies of pandas cells (texts, or token lists without the tokenizer)."""
        return text_vectors(cells, self._steps(), tokenized=not self.getOrDefault("useTokenizer"))

    def _term_frequencies(self, df: DataFrame, tf_col: str) -> tuple[DataFrame, list[str]]:
        """Append hashed term frequencies to ``df`` with SparkML stages; return it and the temporary columns."""
        g, prefix = self.getOrDefault, f"__{self.uid}_"
        text = prefix + "text"
        empty = F.lit("") if g("useTokenizer") else F.array().cast("array<string>")
        df = df.withColumn(text, F.coalesce(column(self.getInputCol()), empty))
        temps, current = [text], text
        stages: list[Any] = []
        if g("useTokenizer"):
            stages.append(RegexTokenizer(pattern=g("tokenizerPattern"), gaps=g("tokenizerGaps"),
                                         minTokenLength=g("minTokenLength"), toLowercase=g("toLowercase")))
        if g("useStopWordsRemover"):
            stages.append(StopWordsRemover(stopWords=self._stop_words(), caseSensitive=g("caseSensitiveStopWords")))
        if g("useNGram"):
            stages.append(NGram(n=g("nGramLength")))
        for i, stage in enumerate(stages):
            out = f"{prefix}{i}"
            df = stage.setInputCol(current).setOutputCol(out).transform(df)
            temps.append(out)
            current = out
        df = HashingTF(inputCol=current, outputCol=tf_col, numFeatures=g("numFeatures"),
                       binary=g("binary")).transform(df)
        return df, temps


class TextFeaturizer(TextFeaturizerNames, IrbisEstimator, _TextFeaturizerParams):
    """Text to a hashed term-frequency vector, IDF-weighted by default, in one estimator.

    Steps, each switchable: regex tokenisation (with lower-casing and a minimum token length),
    stop-word removal, n-grams, hashing term frequencies (``numFeatures`` slots), IDF. Spark
    runs SparkML's own JVM stages; the fitted model runs the same steps on a pandas frame.
    A null text is an empty document (an all-zero vector).

    Bad input: a missing input column raises ``ValueError``; a column that is not a string
    (or, with ``useTokenizer=False``, an array of strings) raises ``TypeError``. Patterns are
    Java regexes in Spark and Python regexes on pandas: keep to their common syntax.

    Examples
    --------
    >>> model = TextFeaturizer(inputCol="review", outputCol="features", useNGram=True).fit(train)  # doctest: +SKIP
    """

    def _fit(self, dataset: Any) -> "TextFeaturizerModel":
        model = TextFeaturizerModel()
        self._copyValues(model)
        if isinstance(dataset, pd.DataFrame):
            require_columns("TextFeaturizer", dataset.columns, [self.getInputCol()])
            if self.getOrDefault("useIDF"):
                tf = self._tf_pandas(dataset[self.getInputCol()].tolist())
                model._idf = fit_idf(tf, self.getOrDefault("minDocFreq"))
        else:
            self._check_input(dataset.schema)
            if self.getOrDefault("useIDF"):
                tf_col = f"__{self.uid}_tf"
                df, _ = self._term_frequencies(dataset, tf_col)
                fitted = self._fit_idf_spark(df, tf_col)
                if isinstance(fitted, IdfState):
                    model._idf = fitted
                else:  # keep the JVM model: its weights reach Python only when needed (save, pandas)
                    model._jvm_idf = fitted
        if self.getOrDefault("useStopWordsRemover") and not self.getOrDefault("stopWords"):
            model._set(stopWords=self._stop_words())
        return model


    def _fit_idf_spark(self, df: DataFrame, tf_col: str) -> IdfState | IDFModel:
        try:
            fitted = IDF(inputCol=tf_col, minDocFreq=self.getOrDefault("minDocFreq")).fit(df)
        except Exception as err:  # noqa: BLE001 - Spark's IDF refuses an empty corpus
            if "Haven't seen any document" not in str(err):
                raise
            return fit_idf(sp.csr_matrix((0, self.getOrDefault("numFeatures"))), self.getOrDefault("minDocFreq"))
        return fitted


class TextFeaturizerModel(IrbisModel, _TextFeaturizerParams):
    """A fitted :class:`TextFeaturizer`: its Params plus the IDF weights (saved beside them)."""

    def _init_state(self) -> None:
        self._idf: IdfState | None = None
        self._jvm_idf: IDFModel | None = None

    def _idf_state(self) -> IdfState | None:
        if self._idf is None and self._jvm_idf is not None:
            fitted = self._jvm_idf
            self._idf = IdfState(fitted.idf.toArray(), np.asarray(fitted.docFreq, dtype=np.int64), int(fitted.numDocs))
        return self._idf

    @property
    def idf(self) -> np.ndarray | None:
        """The IDF weight of each slot (``None`` when ``useIDF`` is false)."""
        state = self._idf_state()
        return None if state is None else state.idf

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        return [(self.getOutputCol(), VectorUDT())]

    def transform_schema(self, schema: StructType) -> StructType:
        """Schema of the output for an input of ``schema``."""
        self._check_input(schema)
        return super().transform_schema(schema)

    def _transform(self, dataset: Any) -> Any:
        if isinstance(dataset, pd.DataFrame):
            return self._transform_pandas_text(dataset)
        self._check_input(dataset.schema)
        out = self.getOutputCol()
        if self._idf is None and self._jvm_idf is None:
            df, temps = self._term_frequencies(dataset, out)
        else:
            tf_col = f"__{self.uid}_tf"
            df, temps = self._term_frequencies(dataset, tf_col)
            scale: IDFModel | ElementwiseProduct
            if self._jvm_idf is not None:
                scale = self._jvm_idf.copy().setInputCol(tf_col).setOutputCol(out)
            else:
                assert self._idf is not None
                scale = ElementwiseProduct(scalingVec=DenseVector(self._idf.idf), inputCol=tf_col, outputCol=out)
            df = scale.transform(df)
            temps.append(tf_col)
        return df.drop(*temps)

    def _transform_pandas_text(self, pdf: pd.DataFrame) -> pd.DataFrame:
        require_columns("TextFeaturizerModel", pdf.columns, [self.getInputCol()])
        tf = self._tf_pandas(pdf[self.getInputCol()].tolist())
        state = self._idf_state()
        if state is not None:
            tf = apply_idf(tf, state)
        out = pdf.copy()
        tf = tf.tocsr()
        size = tf.shape[1]
        # Sparse rows, as SparkML gives them: a dense row of 2^18 doubles would cost 2 MB per text.
        out[self.getOutputCol()] = [SparseVector(size, tf.indices[a:b], tf.data[a:b])
                                    for a, b in zip(tf.indptr[:-1], tf.indptr[1:])]
        return out

    def _save_extra(self, path: str) -> None:
        state = self._idf_state()
        if state is not None:
            np.savez(os.path.join(path, "idf.npz"), idf=state.idf, doc_freq=state.doc_freq, num_docs=state.num_docs)

    def _load_extra(self, path: str) -> None:
        file = os.path.join(path, "idf.npz")
        if os.path.exists(file):
            with np.load(file) as data:
                self._idf = IdfState(data["idf"], data["doc_freq"], int(data["num_docs"]))


TextFeaturizer._model_class = TextFeaturizerModel  # the Model class that TextFeaturizer.fit returns
