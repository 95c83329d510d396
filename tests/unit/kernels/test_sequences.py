"""Length-aware batches (irbis.kernels.sequences): every row once, in order; the budget kept; padding small."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from irbis.kernels.sequences import length_batches, padded_length, run_by_length

lengths_st = st.lists(st.integers(0, 600), min_size=0, max_size=200)


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, budget=st.integers(8, 4096), cap=st.integers(1, 64))
def test_every_row_once_and_the_budget_kept(lengths, budget, cap):
    lengths = np.array(lengths, dtype=np.int64)
    batches = length_batches(lengths, token_budget=budget, max_rows=cap)
    seen = np.concatenate(batches) if batches else np.array([], np.int64)
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= cap
        cost = len(batch) * padded_length(lengths[batch])
        # a row longer than the budget runs alone; every other batch keeps the budget
        assert cost <= budget or len(batch) == 1


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.tuples(st.integers(0, 600), st.integers(1, 20)), max_size=100),
       budget=st.integers(8, 4096), cap=st.integers(1, 64))
def test_items_of_several_rows_stay_whole_and_keep_the_bounds(items, budget, cap):
    lengths = np.array([n for n, _ in items], np.int64)
    rows = np.array([r for _, r in items], np.int64)
    batches = length_batches(lengths, token_budget=budget, max_rows=cap, rows=rows)
    seen = np.concatenate(batches) if batches else np.array([], np.int64)
    assert sorted(seen.tolist()) == list(range(len(items)))
    for batch in batches:
        held = int(rows[batch].sum())
        # an item over either bound runs alone; every other batch keeps both
        assert len(batch) == 1 or (held <= cap and held * padded_length(lengths[batch]) <= budget)
    if len(items):  # with one row an item, the counts change nothing
        ones = length_batches(lengths, token_budget=budget, max_rows=cap, rows=np.ones(len(items)))
        assert [b.tolist() for b in ones] == [b.tolist() for b in length_batches(lengths, token_budget=budget,
                                                                                 max_rows=cap)]


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=120), budget=st.integers(8, 2048))
def test_outputs_come_back_in_the_rows_order(lengths, budget):
    rows = [np.full(n, i, dtype=np.int64) for i, n in enumerate(lengths)]

    def run(ids, mask):  # each row's output: its id and its real length, read from the padded batch
        return np.stack([ids[:, 0], mask.sum(1)], axis=1)

    out, stats = run_by_length(rows, run, token_budget=budget, max_rows=32)
    assert out[:, 0].tolist() == list(range(len(lengths)))
    assert out[:, 1].tolist() == lengths
    assert stats.tokens == sum(lengths) and stats.padded >= stats.tokens


def test_a_row_longer_than_the_budget_runs_alone():
    batches = length_batches(np.array([5, 900, 6, 7]), token_budget=64, max_rows=8)
    assert [b.tolist() for b in batches] == [[0, 2, 3], [1]]


def test_sorting_wastes_far_less_than_arrival_order_on_real_reviews():
    from irbis.demo.reviews import drug_reviews
    from irbis.kernels.text_encoder import text_tokens
    from irbis.models.text_networks import text_source

    ids, _ = text_tokens(text_source("all_minilm_l6_v2"), 256).tokenize(drug_reviews()["review"].tolist())
    lengths = np.array([len(r) for r in ids])
    _, stats = run_by_length(ids, lambda i, m: np.zeros((len(i), 1)), token_budget=4096, max_rows=256)
    arrival = sum(len(c) * padded_length(c) for c in np.array_split(lengths, range(32, len(lengths), 32)))
    assert stats.waste <= 1.10
    assert arrival / lengths.sum() > 1.5 * stats.waste


def test_a_network_says_how_it_takes_sequences_and_an_unknown_way_is_refused_before_training():
    # one rule (irbis.kernels.sequences.input_kind), read by the scoring kernel and the training checks alike
    from types import SimpleNamespace

    import pytest
    import torch

    from irbis.kernels.sequences import input_kind
    from irbis.train.checks import _sequence_output

    class Net(torch.nn.Module):
        input_kind = "ragged"

        def forward(self, x, mask=None):
            return x.float().mean(1, keepdim=True)

    assert input_kind(torch.nn.Identity()) == "padded"
    assert input_kind(SimpleNamespace(input_kind="packed")) == "packed"
    with pytest.raises(ValueError, match=r"input_kind must be one of \['padded', 'packed'\], found 'ragged'"):
        input_kind(Net())
    with pytest.raises(ValueError, match="found 'ragged'"):
        _sequence_output(Net(), "ids")
