"""Unit tests of the vector assembly kernel."""
import numpy as np
import pandas as pd
import pytest

from irbis.kernels.assemble import InputSpec, assemble_frame, assembled_attributes


def _frame():
    return pd.DataFrame(
        {"a": [1.0, 2.0, np.nan], "v": [np.array([1.0, 2.0]), None, np.array([np.nan, 0.0])], "b": [3, 4, 5]}
    )


SPECS = [InputSpec("a", 1), InputSpec("v", 2, True), InputSpec("b", 1)]


def test_assemble_keep_concatenates_in_order_and_fills_missing_with_nan():
    values, keep = assemble_frame(_frame(), SPECS, "keep")
    assert keep.all()
    np.testing.assert_array_equal(values[0], [1.0, 1.0, 2.0, 3.0])
    assert np.isnan(values[1, 1:3]).all() and values[1, 3] == 4.0
    assert np.isnan(values[2, 0]) and np.isnan(values[2, 1])


def test_assemble_skip_drops_rows_with_missing_numbers_or_vectors_but_not_nan_in_vectors():
    frame = _frame()
    frame.loc[2, "a"] = 7.0
    values, keep = assemble_frame(frame, SPECS, "skip")
    assert keep.tolist() == [True, False, True]
    assert values.shape == (2, 4)


def test_assemble_error_names_the_column():
    with pytest.raises(ValueError, match="'a'"):
        assemble_frame(_frame().iloc[[0, 2]], SPECS, "error")
    with pytest.raises(ValueError, match="handleInvalid"):
        assemble_frame(_frame(), SPECS, "drop")


def test_assemble_rejects_vectors_of_wrong_size():
    frame = pd.DataFrame({"v": [np.array([1.0, 2.0, 3.0])]})
    with pytest.raises(ValueError, match="'v'.*size 2.*size 3"):
        assemble_frame(frame, [InputSpec("v", 2, True)], "keep")


def test_attributes_follow_vector_assembler_naming():
    meta = assembled_attributes(
        [
            InputSpec("a", 1),
            InputSpec("v", 2, True),
            InputSpec("w", 2, True, ({"name": "x", "type": "numeric"},
                                     {"name": "c", "type": "binary", "values": ["0", "1"]})),
        ]
    )["ml_attr"]
    assert meta["num_attrs"] == 5
    numeric = meta["attrs"]["numeric"]
    assert [a["name"] for a in numeric] == ["a", "v_0", "v_1", "w_x"]
    assert [a["idx"] for a in numeric] == [0, 1, 2, 3]
    assert meta["attrs"]["binary"] == [{"values": ["0", "1"], "idx": 4, "name": "w_c"}]
