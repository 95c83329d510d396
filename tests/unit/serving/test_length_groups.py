"""A server's drain of text requests cut into length groups by the text stage's own tokens and budget."""
from __future__ import annotations

import numpy as np

from irbis.kernels.chain import KernelChain
from irbis.kernels.sequences import padded_length
from irbis.ml import TextEmbedder, TextTokenizer
from irbis.serving.predictor import Predictor


def _predictor(stage) -> Predictor:
    return Predictor(KernelChain([stage.kernel()]))


def test_requests_are_grouped_by_their_token_length_under_the_stages_budget():
    from text_networks import tiny_text_network

    stage = TextEmbedder(network=tiny_text_network("embedding"), inputCol="review", outputCol="e", tokenBudget=256)
    predictor = _predictor(stage)
    assert predictor.chain.lengths is not None
    words = "the tablets worked well and the side effects were mild "
    requests = [{"review": [words * n]} for n in (12, 1, 6, 1, 12, 2)] + [{"review": [words, words * 3, None]}]
    groups = predictor.length_groups(requests)
    assert sorted(i for g in groups for i in g) == list(range(len(requests)))
    lengths = {i: stage.kernel().lengths.measure(r["review"]).max() for i, r in enumerate(requests)}
    # shortest first, and each group within the budget (rows x its padded longest), unless a request is alone
    longest = [max(lengths[i] for i in g) for g in groups]
    assert longest == sorted(longest) and len(groups) > 1
    for g in groups:
        rows = sum(len(requests[i]["review"]) for i in g)
        assert len(g) == 1 or rows * padded_length(np.array([lengths[i] for i in g])) <= 256
    # the long requests (12 copies) are not grouped with the short ones
    assert not any({0, 1} <= set(g) for g in groups)
    # each group's answers are the whole drain's answers for its requests
    whole = predictor.predict({"review": [v for r in requests for v in r["review"]]})["e"]
    starts = np.cumsum([0] + [len(r["review"]) for r in requests])
    for g in groups:
        part = predictor.predict({"review": [v for i in g for v in requests[i]["review"]]})["e"]
        expected = [whole[k] for i in g for k in range(starts[i], starts[i + 1])]
        for got, want in zip(part, expected):
            assert (got is None) == (want is None)
            if got is not None:
                np.testing.assert_allclose(got, want, atol=1e-5)


def test_one_request_or_a_stage_that_does_not_batch_by_length_is_one_group():
    from text_networks import tiny_text_network

    network = tiny_text_network("embedding")
    embedder = _predictor(TextEmbedder(network=network, inputCol="review", outputCol="e"))
    assert embedder.length_groups([{"review": ["a long text " * 50]}]) == [[0]]
    tokenizer = _predictor(TextTokenizer(network=network, inputCol="review", outputCol="ids"))
    assert tokenizer.chain.lengths is None
    assert tokenizer.length_groups([{"review": ["a " * 300]}, {"review": ["b"]}]) == [[0, 1]]
