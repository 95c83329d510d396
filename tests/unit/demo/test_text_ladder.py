"""The text ladder's choices: drug-grouped folds of the training reviews, and grouped CV that reads only the
rows it is given, holds each out once per setting and keeps the simplest of equal settings."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression

from irbis.demo.text_demo import check_options, reviews_table
from irbis.demo.text_ladder import RUNGS, grouped_cv, majority_scores


def test_folds_hold_whole_drugs_of_the_training_reviews_and_no_test_review():
    data = reviews_table(folds=3, seed=0)
    train, test = data[~data["is_test"]], data[data["is_test"]]
    assert (len(train), len(test)) == (600, 379)
    assert (test["fold"] == -1).all()
    assert set(train["fold"]) == {0, 1, 2}
    assert train.groupby("drug")["fold"].nunique().max() == 1  # a drug's reviews share one fold
    assert train["y"].isin([0.0, 1.0]).all() and 0.5 < train["y"].mean() < 0.8  # positive: the larger class
    assert data["id"].is_unique


def test_a_sample_keeps_both_splits_and_is_reproducible():
    one, again = reviews_table(3, seed=1, sample=50), reviews_table(3, seed=1, sample=50)
    assert one["is_test"].sum() == 50 and (~one["is_test"]).sum() == 50
    pd.testing.assert_frame_equal(one, again)
    assert not one["review"].equals(reviews_table(3, seed=2, sample=50)["review"])


def _separable(n: int, seed: int) -> pd.DataFrame:
    """Rows whose label one feature sets (with 15 % of the labels flipped), the other noise; groups of 4."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    y = ((x[:, 0] > 0) ^ (rng.random(n) < 0.15)).astype(float)
    return pd.DataFrame({"id": np.arange(n), "x0": x[:, 0], "x1": x[:, 1], "y": y, "fold": (np.arange(n) // 4) % 3})


def test_grouped_cv_holds_each_row_out_once_per_setting_and_picks_the_best_out_of_fold():
    rows = _separable(240, seed=0)
    seen_fit, seen_held = [], []

    def fit_score(fit_rows, held, setting):
        seen_fit.append(set(fit_rows["id"]))
        seen_held.append(list(held["id"]))
        model = LogisticRegression(C=setting["C"]).fit(fit_rows[["x0", "x1"]], fit_rows["y"])
        return held["y"].to_numpy(), model.predict_proba(held[["x0", "x1"]])[:, 1]

    calls = []
    grid = [{"C": 1e-4}, {"C": 1.0}]  # 1e-4 shrinks every weight to ~0: all rows scored at the base rate
    best, table = grouped_cv(rows, grid, 3, fit_score, on_fit=lambda: calls.append(1))
    assert best == {"C": 1.0} and table[1] > table[0] + 0.2
    assert len(calls) == len(seen_held) == 6
    held = sorted(i for ids in seen_held for i in ids)
    assert held == sorted(list(rows["id"]) * 2)  # every row held out once per setting
    for fit_ids, held_ids in zip(seen_fit, seen_held):
        assert not fit_ids & set(held_ids)
    serial = grouped_cv(rows, grid, 3, fit_score, parallelism=1)
    assert serial == (best, table)


def test_of_equal_settings_the_first_wins():
    rows = _separable(60, seed=1)

    def constant(fit_rows, held, setting):
        return held["y"].to_numpy(), np.full(len(held), 0.9)

    best, table = grouped_cv(rows, [{"reg": 1.0}, {"reg": 0.1}], 3, constant)
    assert best == {"reg": 1.0} and table[0] == table[1]


def test_the_majority_floor_scores_the_training_majority():
    test = pd.DataFrame({"id": [3, 1, 2], "y": [0.0, 1.0, 0.0]})
    out = majority_scores(np.array([1.0, 1.0, 0.0]), test)
    assert list(out["id"]) == [1, 2, 3] and (out["score"] == 1.0).all()
    assert (majority_scores(np.array([0.0, 0.0, 1.0]), test)["score"] == 0.0).all()


def test_rungs_are_checked_and_put_in_the_ladders_order():
    assert check_options(["MiniLM+LR", "TF-IDF+LR"]) == ["TF-IDF+LR", "MiniLM+LR"]
    assert check_options(None) == list(RUNGS)
    with pytest.raises(ValueError, match="unknown rung.*'LR'.*TF-IDF\\+LR"):
        check_options(["LR"])
    with pytest.raises(ValueError, match="sample must be at least"):
        check_options(None, sample=3)
    with pytest.raises(ValueError, match="folds must be at least 2"):
        check_options(None, folds=1)


