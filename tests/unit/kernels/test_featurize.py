"""Unit tests of the featurisation kernels."""
import datetime as dt

import numpy as np
import pandas as pd
import pytest

from irbis.kernels.mixed_columns import (
    build_column_plan,
    column_stats,
    infer_kind,
    invalid_rows,
    slot_names,
    transform_frame,
)


def _frame():
    return pd.DataFrame(
        {
            "num": [1.0, np.nan, 3.0],
            "flag": [True, False, True],
            "cat": ["red", "blue", "red"],
            "vec": [np.array([1.0, 2.0]), None, np.array([3.0, 4.0])],
            "day": [dt.date(2024, 1, 1), dt.date(2024, 1, 3), None],
        }
    )


def _plans(frame, max_categories=10, buckets=8):
    return [
        build_column_plan(c, infer_kind(frame[c]), column_stats(frame[c], infer_kind(frame[c])), max_categories,
                          buckets)
        for c in frame.columns
    ]


def test_kinds_are_inferred():
    f = _frame()
    assert [infer_kind(f[c]) for c in f.columns] == ["numeric", "boolean", "string", "vector", "date"]


def test_plan_imputes_flags_and_one_hot_encodes():
    f = _frame()
    plans = _plans(f)
    names = [n for p in plans for n in slot_names(p)]
    assert names[:4] == ["num", "num_missing", "flag", "cat=red"]
    assert "cat=__other__" in names and "vec_missing" in names and "day_weekday" in names
    out = transform_frame(f, plans)
    assert out.shape == (3, len(names))
    row = dict(zip(names, out[1]))
    assert row["num"] == 2.0 and row["num_missing"] == 1.0
    assert row["cat=blue"] == 1.0 and row["cat=red"] == 0.0
    assert (row["vec_0"], row["vec_1"], row["vec_missing"]) == (2.0, 3.0, 1.0)
    first = dict(zip(names, out[0]))
    assert (first["day_year"], first["day_month"], first["day_day"], first["day_weekday"]) == (2024, 1, 1, 0)
    assert dict(zip(names, out[2]))["day_day"] == 2.0  # mean of Jan 1 and Jan 3


def test_unseen_levels_go_to_other_and_high_cardinality_is_hashed():
    f = _frame()
    plans = _plans(f, max_categories=1, buckets=4)
    cat = next(p for p in plans if p["name"] == "cat")
    assert cat["kind"] == "hashed" and cat["buckets"] == 4
    plans = _plans(f)
    new = f.copy()
    new.loc[0, "cat"] = "green"
    names = [n for p in plans for n in slot_names(p)]
    assert dict(zip(names, transform_frame(new, plans)[0]))["cat=__other__"] == 1.0


def test_wrong_vector_size_is_named():
    f = _frame()
    plans = _plans(f)
    bad = f.copy()
    bad.at[0, "vec"] = np.ones(3)
    with pytest.raises(ValueError, match="'vec'.*size 2.*size 3"):
        transform_frame(bad, plans)


def test_missing_timestamps_are_flagged():
    f = pd.DataFrame({"ts": pd.to_datetime(["2024-01-01 10:00", None, "2024-01-01 12:00"])})
    plans = _plans(f)
    assert plans[0]["kind"] == "timestamp" and plans[0]["flag"]
    out = transform_frame(f, plans)
    assert out[1, 4] == 11.0 and out[1, -1] == 1.0 and out[0, -1] == 0.0


def test_a_numeric_column_planned_without_imputation_is_invalid_where_missing():
    frame = pd.DataFrame({"num": [1.0, None, np.nan, 4.0], "flag": [True, None, False, True]})
    kinds = {c: infer_kind(frame[c]) for c in frame.columns}
    plans = [build_column_plan(c, kinds[c], column_stats(frame[c], kinds[c]), 10, 8, impute=False) for c in frame]
    assert [slot_names(p) for p in plans] == [["num"], ["flag", "flag_missing"]]  # only numbers go unimputed
    assert invalid_rows(frame, plans).tolist() == [False, True, True, False]
    kept = transform_frame(frame, plans, "keep")
    assert kept[[0, 3], 0].tolist() == [1.0, 4.0] and np.isnan(kept[[1, 2], 0]).all()
    assert kept[1, 1:].tolist() == [2 / 3, 1.0]  # the boolean is imputed and flagged as before
    with pytest.raises(ValueError, match="column 'num' has a missing value .* in row 1"):
        transform_frame(frame, plans, "error")
    assert transform_frame(frame.iloc[[0, 3]], plans, "error")[:, 0].tolist() == [1.0, 4.0]
