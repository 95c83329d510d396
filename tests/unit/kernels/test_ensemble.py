"""Unit tests of the ensemble-by-key kernel."""
import numpy as np
import pandas as pd
import pytest

from irbis.kernels.ensemble import combine_values, ensemble_frame


def _frame():
    return pd.DataFrame(
        {
            "k": ["a", "a", "b", None, "b"],
            "x": [1.0, 3.0, np.nan, 4.0, 6.0],
            "v": [np.array([1.0, 2.0]), np.array([3.0, 6.0]), None, np.array([0.0, 1.0]), np.array([2.0, 2.0])],
        }
    )


def test_mean_collapses_groups_in_first_appearance_order_and_skips_missing():
    out = ensemble_frame(_frame(), ["k"], ["x", "v"])
    assert out["k"].tolist() == ["a", "b", None]
    assert out["mean(x)"].tolist() == [2.0, 6.0, 4.0]
    np.testing.assert_array_equal(out["mean(v)"][0], [2.0, 4.0])
    np.testing.assert_array_equal(out["mean(v)"][1], [2.0, 2.0])


def test_other_strategies_and_names():
    out = ensemble_frame(_frame(), ["k"], ["x", "v"], ["sx", "mv"], strategy="max")
    assert out["sx"].tolist() == [3.0, 6.0, 4.0]
    np.testing.assert_array_equal(out["mv"][0], [3.0, 6.0])
    with pytest.raises(ValueError, match="strategy"):
        ensemble_frame(_frame(), ["k"], ["x"], strategy="mode")
    with pytest.raises(ValueError, match="colNames"):
        ensemble_frame(_frame(), ["k"], ["x"], ["a", "b"])


def test_keep_rows_appends_group_value_to_every_row():
    out = ensemble_frame(_frame(), ["k"], ["x"], collapse_group=False)
    assert len(out) == 5
    assert out["mean(x)"].tolist() == [2.0, 2.0, 6.0, 4.0, 6.0]
    assert out["x"].isna().sum() == 1


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="nope"):
        ensemble_frame(_frame(), ["nope"], ["x"])
    with pytest.raises(ValueError, match="'v'.*different lengths"):
        combine_values([np.ones(2), np.ones(3)], "mean", "v", True)
    assert combine_values([None, np.nan], "mean", "x", False) is None


def test_empty_frame_gives_empty_result():
    out = ensemble_frame(_frame().iloc[:0], ["k"], ["x"])
    assert list(out.columns) == ["k", "mean(x)"] and len(out) == 0
