"""Text featurisation kernels: tokens, stop words, n-grams, hashed term frequencies, IDF.

Pure counterparts of SparkML's ``RegexTokenizer``, ``StopWordsRemover``, ``NGram``,
``HashingTF`` and ``IDF``, with the same semantics, so a :class:`irbis.ml.TextFeaturizer`
fitted in Spark gives the same vectors on a pandas frame or in the HTTP server:

* hashing is MurmurHash3 (x86, 32 bit, seed 42) of the term's UTF-8 bytes, index
  ``hash mod numFeatures`` made non-negative, as ``HashingTF`` does since Spark 3;
* IDF is ``log((m + 1) / (df + 1))`` over ``m`` documents, and 0 for terms seen in fewer
  than ``min_doc_freq`` documents.

A missing text (``None``) is an empty document: it yields no tokens and an all-zero vector.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

HASH_SEED = 42
_M32 = 0xFFFFFFFF


def tokenize(
    text: str | None,
    pattern: str = r"\s+",
    gaps: bool = True,
    min_token_length: int = 1,
    to_lowercase: bool = True,
) -> list[str]:
    """Split one text into tokens with a regular expression.

    Parameters
    ----------
    text : str or None
        The document; ``None`` gives no tokens.
    pattern : str
        Regular expression: the separators when ``gaps`` is true, else the tokens.
    gaps : bool
        Whether ``pattern`` matches separators (``re.split``) or tokens (``re.findall``).
    min_token_length : int
        Shorter tokens are dropped.
    to_lowercase : bool
        Lower-case the text first.

    Examples
    --------
    >>> tokenize("Hello, big World", pattern=r"\\W+")
    ['hello', 'big', 'world']
    """
    if text is None:
        return []
    if to_lowercase:
        text = text.lower()
    regex = re.compile(pattern)
    tokens = regex.split(text) if gaps else regex.findall(text)
    while tokens and tokens[-1] == "":
        tokens.pop()
    return [t for t in tokens if len(t) >= min_token_length]


def remove_stop_words(
    tokens: Sequence[str], stop_words: Iterable[str], case_sensitive: bool = False
) -> list[str]:
    """Drop the tokens that are stop words (compared lower-cased unless ``case_sensitive``)."""
    if case_sensitive:
        stops = set(stop_words)
        return [t for t in tokens if t not in stops]
    stops = {w.lower() for w in stop_words}
    return [t for t in tokens if t.lower() not in stops]


def ngrams(tokens: Sequence[str], n: int) -> list[str]:
    """Return the space-joined n-grams of ``tokens`` (none when there are fewer than ``n``)."""
    if n < 1:
        raise ValueError(f"n-gram length must be >= 1, found {n}")
    return [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k(k: int) -> int:
    k = (k * 0xCC9E2D51) & _M32
    return (_rotl(k, 15) * 0x1B873593) & _M32


def murmur3_32(data: bytes, seed: int = HASH_SEED) -> int:
    """MurmurHash3 x86 32-bit of ``data``, as a signed 32-bit integer (Java's ``int``)."""
    h = seed & _M32
    n_blocks = len(data) // 4
    for k in np.frombuffer(data[: n_blocks * 4], dtype="<u4").tolist():
        h = _rotl(h ^ _mix_k(k), 13)
        h = (h * 5 + 0xE6546B64) & _M32
    tail = data[n_blocks * 4 :]
    if tail:
        h ^= _mix_k(int.from_bytes(tail, "little"))
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def term_index(term: str, num_features: int) -> int:
    """Column of ``term`` in a hashed vector of ``num_features`` slots (as ``HashingTF``)."""
    return murmur3_32(term.encode("utf-8")) % num_features


def hashing_tf(
    documents: Sequence[Sequence[str]], num_features: int = 1 << 18, binary: bool = False
) -> sp.csr_matrix:
    """Hashed term frequencies of tokenised documents, one sparse row per document.

    Parameters
    ----------
    documents : sequence of sequences of str
        Token lists (a ``None`` entry is an empty document).
    num_features : int
        Number of hash buckets (vector size).
    binary : bool
        Record presence (1.0) instead of counts.
    """
    if num_features < 1:
        raise ValueError(f"numFeatures must be >= 1, found {num_features}")
    cache: dict[str, int] = {}
    rows, cols = [], []
    for row, doc in enumerate(documents):
        for term in doc or ():
            if term not in cache:
                cache[term] = term_index(term, num_features)
            rows.append(row)
            cols.append(cache[term])
    data = np.ones(len(rows))
    out = sp.csr_matrix((data, (rows, cols)), shape=(len(documents), num_features))
    out.sum_duplicates()
    if binary:
        out.data[:] = 1.0
    return out


@dataclass(frozen=True)
class IdfState:
    """Fitted IDF: the weight of each slot, its document frequency and the corpus size."""

    idf: np.ndarray
    doc_freq: np.ndarray
    num_docs: int


def fit_idf(tf: sp.spmatrix, min_doc_freq: int = 0) -> IdfState:
    """Fit IDF weights ``log((m + 1) / (df + 1))`` on a term-frequency matrix."""
    tf = sp.csr_matrix(tf)
    doc_freq = np.bincount(tf.indices[tf.data != 0], minlength=tf.shape[1]).astype(np.int64)
    m = tf.shape[0]
    idf = np.log((m + 1.0) / (doc_freq + 1.0))
    idf[doc_freq < min_doc_freq] = 0.0
    return IdfState(idf=idf, doc_freq=doc_freq, num_docs=m)


def apply_idf(tf: sp.spmatrix, state: IdfState) -> sp.csr_matrix:
    """Scale each term frequency by the IDF weight of its slot."""
    if tf.shape[1] != state.idf.shape[0]:
        raise ValueError(
            f"term-frequency vectors have {tf.shape[1]} slots but the IDF was fitted on "
            f"{state.idf.shape[0]}; use the same numFeatures for fitting and transforming"
        )
    return sp.csr_matrix(tf.multiply(state.idf[None, :]))


@dataclass(frozen=True)
class TextSteps:
    """Which text steps run and how; mirrors the Params of :class:`irbis.ml.TextFeaturizer`.

    ``stop_words`` is ``None`` to skip stop-word removal and ``ngram_length`` is ``None``
    (or 1) to keep single tokens.
    """

    pattern: str = r"\s+"
    gaps: bool = True
    min_token_length: int = 1
    to_lowercase: bool = True
    stop_words: tuple[str, ...] | None = None
    case_sensitive_stop_words: bool = False
    ngram_length: int | None = None
    num_features: int = 1 << 18
    binary: bool = False


def process_tokens(tokens: Sequence[str] | None, steps: TextSteps) -> list[str]:
    """Stop-word removal and n-grams over one token list, as configured (``None``: no tokens)."""
    tokens = list(tokens) if tokens is not None else []
    if steps.stop_words is not None:
        tokens = remove_stop_words(tokens, steps.stop_words, steps.case_sensitive_stop_words)
    if steps.ngram_length and steps.ngram_length > 1:
        tokens = ngrams(tokens, steps.ngram_length)
    return tokens


def documents_terms(
    texts: Iterable[str | None], steps: TextSteps, tokenized: bool = False
) -> list[list[str]]:
    """Run tokenisation (unless ``tokenized``: texts are token lists), stop words and n-grams."""
    docs = []
    for text in texts:
        tokens = text if tokenized else tokenize(text, steps.pattern, steps.gaps, steps.min_token_length,
                                                 steps.to_lowercase)
        docs.append(process_tokens(tokens, steps))
    return docs


def text_vectors(
    texts: Iterable[str | None], steps: TextSteps, idf: IdfState | None = None, tokenized: bool = False
) -> sp.csr_matrix:
    """Texts (or token lists when ``tokenized``) to (optionally IDF-weighted) hashed term frequencies."""
    tf = hashing_tf(documents_terms(texts, steps, tokenized), steps.num_features, steps.binary)
    return apply_idf(tf, idf) if idf is not None else tf
