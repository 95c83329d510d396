"""LIME on words (irbis.explain.explanations.explain_text): the word that decides a score is found, the rest is kept."""
from __future__ import annotations

import numpy as np
import pytest

from irbis.explain.explanations import explain_text, mask_text, text_words


def test_masking_removes_words_and_keeps_the_rest():
    text = "Snow, leopard: rare!"
    words = text_words(text)
    assert [text[a:b] for a, b in words] == ["Snow", "leopard", "rare"]
    assert mask_text(text, words, np.array([[True, False, True], [False, False, False]])) == ["Snow, : rare!", ", : !"]


def test_the_deciding_word_gets_the_largest_weight():
    def score(texts):  # class 1: "excellent" present; class 0 its complement
        hit = np.array(["excellent" in t for t in texts], np.float64)
        return np.stack([1 - hit, hit], axis=1)

    text = "The staff were kind, the room was clean and the food excellent overall."
    found = explain_text(text, score, [1, 0], num_samples=300, seed=1)
    words = [text[a:b] for a, b in found.segments]
    assert words[int(np.argmax(found.weights[0]))] == "excellent"
    assert words[int(np.argmin(found.weights[1]))] == "excellent"
    others = np.delete(found.weights[0], words.index("excellent"))
    assert np.abs(others).max() < 0.05 < found.weights[0].max()
    assert found.r2[0] > 0.99


def test_too_few_samples_for_the_words_is_refused():
    with pytest.raises(ValueError, match="numSamples=3 is below the number of words"):
        explain_text("one two three four", lambda t: np.zeros((len(t), 1)), [0], num_samples=3)
