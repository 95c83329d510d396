"""Unit tests of the text kernels (SparkML semantics without a JVM)."""
import numpy as np
import pytest

from irbis.kernels.text_features import (
    TextSteps,
    apply_idf,
    documents_terms,
    fit_idf,
    hashing_tf,
    murmur3_32,
    ngrams,
    remove_stop_words,
    text_vectors,
    tokenize,
)


def test_murmur3_matches_reference_vectors():
    # Reference values of MurmurHash3_x86_32 (Appleby's test suite), as signed ints.
    assert murmur3_32(b"", 0) == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"hello", 0) == 0x248BFA47
    assert murmur3_32(b"foo", 0) == -156908512
    assert murmur3_32(b"Hello, world!", 0x9747B28C) == 0x24884CBA
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog", 0x9747B28C) == 0x2FA826CD


def test_tokenize_gaps_and_patterns():
    assert tokenize("  Hello World  ") == ["hello", "world"]
    assert tokenize("Hello, big World", pattern=r"\W+") == ["hello", "big", "world"]
    assert tokenize("a bb ccc", min_token_length=2) == ["bb", "ccc"]
    assert tokenize("Ab1 cd", pattern=r"[a-z]+", gaps=False, to_lowercase=False) == ["b", "cd"]
    assert tokenize(None) == []


def test_stop_words_and_ngrams():
    assert remove_stop_words(["The", "cat"], ["the"]) == ["cat"]
    assert remove_stop_words(["The", "cat"], ["the"], case_sensitive=True) == ["The", "cat"]
    assert ngrams(["a", "b", "c"], 2) == ["a b", "b c"]
    assert ngrams(["a"], 2) == []
    with pytest.raises(ValueError):
        ngrams(["a"], 0)


def test_hashing_tf_counts_and_binary():
    tf = hashing_tf([["a", "b", "a"], [], None], num_features=16)
    assert tf.shape == (3, 16)
    assert tf[0].sum() == 3 and tf[0].max() == 2 and tf[1].nnz == 0 and tf[2].nnz == 0
    assert hashing_tf([["a", "a"]], 16, binary=True).max() == 1.0


def test_idf_formula_and_min_doc_freq():
    tf = hashing_tf([["a", "b"], ["a"], ["c"]], num_features=64)
    state = fit_idf(tf, min_doc_freq=2)
    a = hashing_tf([["a"]], 64).indices[0]
    b = hashing_tf([["b"]], 64).indices[0]
    assert state.doc_freq[a] == 2 and state.num_docs == 3
    assert state.idf[a] == pytest.approx(np.log(4 / 3))
    assert state.idf[b] == 0.0  # seen once < min_doc_freq
    out = apply_idf(tf, state)
    assert out[1, a] == pytest.approx(np.log(4 / 3))
    with pytest.raises(ValueError, match="numFeatures"):
        apply_idf(hashing_tf([["a"]], 8), state)


def test_steps_compose():
    steps = TextSteps(pattern=r"\W+", stop_words=("the",), ngram_length=2, num_features=32)
    assert documents_terms(["The red, red fox", None], steps) == [["red red", "red fox"], []]
    assert text_vectors(["The red, red fox"], steps).sum() == 2
