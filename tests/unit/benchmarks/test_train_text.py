"""The text fine-tuning benchmark's own logic: its batches, their padding, the DDP halves and the table."""

import sys
from pathlib import Path

import numpy as np
import pytest

from irbis.demo.reviews import drug_reviews

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from train_text import GLOBAL_BATCH, MAX_LENGTH, _Batches, batch_order, padding_waste, table, token_ids  # noqa: E402


@pytest.fixture(scope="module")
def reviews():
    """The shipped training reviews' token ids, labels and the padding id."""
    frame = drug_reviews("train")
    ids, pad_id = token_ids(frame["review"].tolist())
    return ids, (frame["sentiment"] == "positive").to_numpy().astype(np.int64), pad_id


def test_the_reviews_are_tokenized_as_the_encoder_does_truncated_at_max_length(reviews):
    from irbis.kernels.text_encoder import TextTokens
    from irbis.models.text_networks import text_source

    ids, _, _ = reviews
    tokens = TextTokens(text_source("all_minilm_l6_v2"), MAX_LENGTH)
    theirs, _ = tokens.tokenize(drug_reviews("train")["review"].tolist())
    assert max(len(r) for r in ids) == MAX_LENGTH  # the long tail is cut
    assert all(np.array_equal(a, b) for a, b in zip(ids, theirs))


def test_each_order_takes_every_review_once_and_grouping_cuts_the_padding(reviews):
    ids, _, _ = reviews
    lengths = np.array([len(r) for r in ids])
    for grouped in (False, True):
        batches = batch_order(lengths, GLOBAL_BATCH, 0, grouped)
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(len(ids)))
        assert all(len(b) <= GLOBAL_BATCH for b in batches)
        assert all(np.array_equal(a, b) for a, b in zip(batches, batch_order(lengths, GLOBAL_BATCH, 0, grouped)))
    assert not np.array_equal(np.concatenate(batch_order(lengths, GLOBAL_BATCH, 0, True)),
                              np.concatenate(batch_order(lengths, GLOBAL_BATCH, 1, True)))
    grouped = padding_waste(lengths, batch_order(lengths, GLOBAL_BATCH, 0, True))
    shuffled = padding_waste(lengths, batch_order(lengths, GLOBAL_BATCH, 0, False))
    assert 1.0 <= grouped <= 1.10 < shuffled


def test_each_ddp_process_gets_every_second_row_of_each_global_batch(reviews):
    ids, labels, pad_id = reviews
    lengths = np.array([len(r) for r in ids])
    order = batch_order(lengths, GLOBAL_BATCH, 0, True) + [np.array([3])]  # a batch too small to split
    halves = [_Batches(ids, labels, order, rank, 2, pad_id) for rank in (0, 1)]
    assert len(halves[0]) == len(halves[1]) == len(order) - 1
    for b, first, second in zip(order, *halves):
        assert np.array_equal(np.sort(np.concatenate([first, second])), np.sort(b))
        assert abs(len(first) - len(second)) <= 1
    x, mask, y = halves[1][halves[1].batches[0]]
    rows = halves[1].batches[0]
    assert x.shape == (len(rows), lengths[rows].max()) and int(mask.sum()) == int(lengths[rows].sum())
    assert (x[mask == 0] == pad_id).all() and np.array_equal(y.numpy(), labels[rows])


def row(label, e2e, loop):
    return {"label": label, "e2e": e2e, "loop": loop, "samples": 100, "seconds": 100 / e2e, "acc": 0.8,
            "memory": {"cpu_seconds": 10.0, "peak_sum_mib": 1000.0, "largest_mib": 600.0}, "load": (1.0, 1.0)}


def test_a_row_that_cannot_train_is_named_and_the_others_keep_their_ratios():
    lines = table([row("(a) plain", 10.0, 20.0), row("(b) TorchDistributor", 8.0, 16.0),
                   {"label": "(c) TextClassifier", "error": "ValueError: no", "load": (1.0, 1.0)}])
    assert lines[-1].startswith("(c) TextClassifier") and lines[-1].endswith("not available: ValueError: no")
    assert "0.80x" in lines[3] and "1.25x" in lines[2]  # (b) over (a); (a) over (b)
