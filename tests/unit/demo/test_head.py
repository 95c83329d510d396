"""The +T head's grouped cross-validation (pure torch, no Spark)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from irbis.demo.head import (
    DECAY_OPTIMIZERS,
    HEAD_GRID,
    cross_validate_head,
    one_standard_error,
    standardize,
    train_head,
)
from irbis.demo.stats import roc_auc


def _blobs(n=1000, d=16, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, d)).astype(np.float32) * 5 + 100  # far from standardised
    x[:, 0] += 25 * y  # one informative feature
    return x, y


def test_every_decay_of_the_grid_has_its_optimizer():
    assert set(HEAD_GRID["weight_decay"]) == set(DECAY_OPTIMIZERS)


def test_standardize_uses_the_training_statistics_only():
    train, other = np.array([[0.0, 5.0], [2.0, 5.0]]), np.array([[4.0, 6.0]])
    z_train, z_other = standardize(train, other)
    assert np.allclose(z_train.mean(axis=0), 0) and np.allclose(z_train[:, 0].std(), 1)
    assert np.allclose(z_other, [[3.0, 1.0]])  # a constant feature is centred, not divided by 0


def test_trained_head_separates_the_classes_and_reports_each_epoch():
    x, y = _blobs()
    (z,) = standardize(x)
    seen = []
    module = train_head(z, y, hidden=8, weight_decay=1e-4, epochs=30, on_epoch=lambda e, m: seen.append(e))
    import torch

    with torch.inference_mode():
        s = torch.softmax(module(torch.from_numpy(z)), 1)[:, 1].numpy()
    assert seen == list(range(1, 31))
    assert roc_auc(y, s) > 0.95


def test_cross_validation_picks_a_setting_of_the_grid_by_mean_auc():
    x, y = _blobs(600)
    fold = np.arange(len(y)) % 3
    grid = {"hidden": (4, 16), "weight_decay": (1e-4, 1e-2)}
    best, table = cross_validate_head(x, y, fold, grid=grid, epochs=(10, 30))
    assert len(table) == 2 * 2 * 2
    assert best["hidden"] in grid["hidden"] and best["weight_decay"] in grid["weight_decay"]
    assert best["epochs"] in (10, 30)
    assert best["best_cv_auc"] == max(table.values())
    assert best["cv_auc"] == table[f"{best['hidden']}/{best['weight_decay']:g}/{best['epochs']}"]
    assert best["best_cv_auc"] - best["cv_se"] <= best["cv_auc"] + 1e-4  # within one standard error
    assert best["cv_auc"] > 0.9


def test_two_runs_of_the_selection_give_the_same_choice_and_scores():
    x, y = _blobs(300)
    x[:, 1] += 3 * np.random.default_rng(1).normal(size=len(y)) * y  # a second, noisy feature: scores differ
    fold = np.arange(len(y)) % 3
    grid = {"hidden": (4, 16), "weight_decay": (1e-4, 1e-2)}
    threads = torch.get_num_threads()
    first = cross_validate_head(x, y, fold, seed=3, grid=grid, epochs=(2, 5))
    second = cross_validate_head(x, y, fold, seed=3, grid=grid, epochs=(2, 5))
    assert first == second
    assert len(set(first[1].values())) > 1  # the settings were really compared
    assert torch.get_num_threads() == threads  # the CV's single thread is given back


def test_one_standard_error_rule_prefers_the_simplest_setting_within_the_noise():
    noisy = {(128, 1e-4, 40): [0.84, 0.80, 0.86], (32, 1e-4, 40): [0.83, 0.80, 0.85],
             (32, 1e-2, 20): [0.82, 0.79, 0.85], (32, 1e-2, 10): [0.60, 0.55, 0.62]}
    (choice, se) = one_standard_error(noisy)
    assert np.isclose(se, np.std([0.84, 0.80, 0.86], ddof=1) / np.sqrt(3))
    assert choice == (32, 1e-2, 20)  # smallest width, then largest decay, then fewest epochs within 1 SE
    clear = {(128, 1e-4, 40): [0.95, 0.94, 0.96], (32, 1e-2, 10): [0.80, 0.79, 0.81]}
    assert one_standard_error(clear)[0] == (128, 1e-4, 40)  # a gap beyond the noise is kept


def test_bad_arguments_are_refused():
    x, y = _blobs(30)
    with pytest.raises(ValueError, match="at least 2 folds"):
        cross_validate_head(x, y, np.zeros(len(y)))
    with pytest.raises(ValueError, match="weight_decay must be one of"):
        train_head(x, y, hidden=4, weight_decay=0.5, epochs=1)
