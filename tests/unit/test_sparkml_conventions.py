"""Spark ML's setter convention and SynapseML's names on Featurize, FastVectorAssembler and EnsembleByKey.

A SynapseML or Spark ML user's first line is a chain of setters; SynapseML's Featurize also has
numFeatures, imputeMissing and vectorAssemblerHandleInvalid, and its EnsembleByKey answers the derived
output names from getColNames.
"""
from __future__ import annotations

import pandas as pd
import pytest

from irbis.errors import ParamValueError


def test_featurize_and_the_assembler_take_setters():
    from irbis.ml import FastVectorAssembler, Featurize

    stage = Featurize().setInputCols(["age", "city"]).setOutputCol("f").setMaxCategories(3)
    assert (stage.getInputCols(), stage.getOutputCol(), stage.getMaxCategories()) == (["age", "city"], "f", 3)
    assembler = FastVectorAssembler().setInputCols(["a", "b"]).setOutputCol("v").setHandleInvalid("skip")
    assert (assembler.getInputCols(), assembler.getHandleInvalid()) == (["a", "b"], "skip")
    with pytest.raises(ParamValueError, match="handleInvalid"):
        assembler.setHandleInvalid("drop")


def test_featurize_takes_synapsemls_names():
    from irbis.ml import Featurize

    stage = Featurize(inputCols=["city"], outputCol="f", maxCategories=1, numFeatures=4)
    assert stage.getNumHashBuckets() == 4 and stage.setNumFeatures(8).getNumFeatures() == 8
    assert stage.getImputeMissing() is True and stage.getVectorAssemblerHandleInvalid() == "error"
    stage.setVectorAssemblerHandleInvalid("keep")
    assert stage.setImputeMissing(False).getImputeMissing() is False
    with pytest.raises(TypeError, match="imputeMissing"):
        stage.setImputeMissing("no")
    frame = pd.DataFrame({"city": ["a", "b", "c", None, "a"]})
    out = stage.fit(frame).transform(frame)
    # more than maxCategories distinct strings: hashed into numFeatures (numHashBuckets) slots, plus the
    # flag of the missing value; imputeMissing concerns numbers, so the string column is the same either way
    assert {len(v) for v in out["f"]} == {8 + 1}


def test_ensemble_by_key_answers_the_derived_column_names():
    from irbis.ml import EnsembleByKey

    assert EnsembleByKey(keys=["k"], cols=["score"]).getColNames() == ["mean(score)"]
    assert EnsembleByKey(keys=["k"], cols=["a", "b"], strategy="max").getColNames() == ["max(a)", "max(b)"]
    assert EnsembleByKey(keys=["k"], cols=["score"], colNames=["avg"]).getColNames() == ["avg"]
