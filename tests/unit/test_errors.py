"""Errors that cross processes as JSON records come back as the same class with the same message."""

from __future__ import annotations

import pickle

import pytest

from irbis.errors import ColumnNotFoundError, from_record, require_columns, to_record, with_fields


def test_missing_column_names_the_stage_column_and_the_columns_found():
    with pytest.raises(ColumnNotFoundError) as info:
        require_columns("Stage", ["a", "b"], ["a", "z"], role="featuresCol")
    assert str(info.value) == "Stage: featuresCol 'z' not found; the DataFrame has columns ['a', 'b']."
    assert isinstance(info.value, ValueError) and info.value.column == "z" and info.value.found == ["a", "b"]
    require_columns("Stage", ["a", "b"], ["b", "a"])  # all there: no error


def test_a_record_raises_the_same_class_message_and_fields():
    err = with_fields(ValueError("labelCol 'y' must hold class indices"), column="y", found=[0, 12])
    back = from_record(to_record(err))
    assert type(back) is ValueError and str(back) == str(err)
    assert back.column == "y" and back.found == [0, 12]
    missing = from_record(to_record(ColumnNotFoundError("S", "x", ["a"])))
    assert type(missing) is ColumnNotFoundError and missing.column == "x" and str(missing).startswith("S: input")


def test_an_unknown_type_comes_back_as_a_runtime_error_naming_it():
    class Strange(Exception):
        pass

    back = from_record(to_record(Strange("odd")))
    assert type(back) is RuntimeError and str(back) == "Strange: odd"


def test_column_not_found_pickles():
    err = pickle.loads(pickle.dumps(ColumnNotFoundError("S", "x", ["a"], role="labelCol")))
    assert str(err) == "S: labelCol 'x' not found; the DataFrame has columns ['a']." and err.role == "labelCol"
