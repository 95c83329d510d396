"""The Param tables (irbis.ml.params): a stage that declares a Param as another table does takes that row."""
from __future__ import annotations

import pytest

from irbis.ml.params import SHARED_PARAMS, row_named, rows_named


def test_a_row_taken_by_name_is_the_tables_own_and_a_missing_or_twice_declared_name_is_refused():
    token_budget = row_named("tokenBudget", SHARED_PARAMS)
    assert token_budget[0] == "tokenBudget" and token_budget in SHARED_PARAMS
    picked = rows_named(("tokenBudget", "network"), SHARED_PARAMS)
    assert [r[0] for r in picked] == [r[0] for r in SHARED_PARAMS if r[0] in ("tokenBudget", "network")]
    with pytest.raises(KeyError, match="'nope'"):
        row_named("nope", SHARED_PARAMS)
    with pytest.raises(KeyError, match=r"\[2\] times.*'network'"):
        rows_named(["network"], SHARED_PARAMS, SHARED_PARAMS)


def test_the_estimators_that_share_a_row_declare_the_same_param():
    from irbis.ml import TextClassifier, TorchEstimator

    for name in ("tokenBudget",):
        doc = row_named(name, SHARED_PARAMS)[1]
        assert TorchEstimator().getParam(name).doc == doc
        assert TextClassifier().getParam(name).doc == doc
        assert TorchEstimator().getOrDefault(name) == TextClassifier().getOrDefault(name)
