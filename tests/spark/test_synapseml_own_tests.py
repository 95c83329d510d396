"""SynapseML's own Python tests of Featurize and EnsembleByKey, run against Irbis under SynapseML's module names.

Ported from SynapseML's ``core/src/test/python/synapsemltest/featurize/test_featurize.py`` and
``core/src/test/python/synapsemltest/stages/test_ensemble_by_key.py``: the same data, calls and facts,
in this project's words. The ``synapse.ml.featurize`` and ``synapse.ml.stages`` modules are stand-ins
that hand out Irbis's stages, whose aliases (:mod:`irbis.ml.synapseml`) take SynapseML's names.
"""

from __future__ import annotations

import importlib
import math
import sys
import types

import pytest
from pyspark.ml import Pipeline
from pyspark.sql.types import DoubleType, IntegerType, StructField, StructType

pytestmark = pytest.mark.spark


@pytest.fixture
def synapse(monkeypatch):
    """``import synapse.ml.featurize`` and ``synapse.ml.stages`` give Irbis's Featurize and EnsembleByKey."""
    from irbis.ml.ensemble_by_key import EnsembleByKey
    from irbis.ml.featurize import Featurize

    modules = {"synapse": {}, "synapse.ml": {}, "synapse.ml.featurize": {"Featurize": Featurize},
               "synapse.ml.stages": {"EnsembleByKey": EnsembleByKey}}
    for name, names in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(names)
        monkeypatch.setitem(sys.modules, name, module)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    return importlib.import_module("synapse.ml")


def test_featurize_keeps_the_rows_of_missing_numbers_when_told_to(spark, synapse):
    from synapse.ml.featurize import Featurize

    schema = StructType([StructField("id", IntegerType(), nullable=False),
                         StructField("value", DoubleType(), nullable=True)])
    data = spark.createDataFrame([(0, 1.0), (1, None), (2, float("nan")), (3, 4.0)], schema)
    stage = (Featurize().setInputCols(["value"]).setOutputCol("features")
             .setImputeMissing(False).setVectorAssemblerHandleInvalid("keep"))
    assert stage.getVectorAssemblerHandleInvalid() == "keep"

    scored = Pipeline(stages=[stage]).fit(data).transform(data)
    first = {row.id: row.features[0] for row in scored.select("id", "features").collect()}
    assert sorted(first) == [0, 1, 2, 3]  # no row dropped
    assert first[0] == 1.0 and first[3] == 4.0
    assert math.isnan(first[1]) and math.isnan(first[2])  # a null and a NaN both stay missing


def test_ensemble_by_key_names_its_outputs_from_its_params(spark, synapse, tmp_path):
    from synapse.ml.stages import EnsembleByKey

    data = spark.createDataFrame([("group", 1.0, 2.0), ("group", 3.0, 4.0)], ["key", "score", "other"])
    with pytest.raises(ValueError, match="keys"):
        EnsembleByKey(keys=[], cols=["score"]).transform(data)

    stage = EnsembleByKey(keys=["key"], cols=["score"])
    assert stage.getColNames() == ["mean(score)"] and not stage.isSet(stage.colNames)
    assert stage.transform(data).collect()[0]["mean(score)"] == 2.0
    assert not stage.isSet(stage.colNames)  # transforming derives the names, it does not set them

    stage.setCols(["score", "other"])
    assert stage.getColNames() == ["mean(score)", "mean(other)"]  # the names follow cols
    stage.write().save(str(tmp_path / "derived"))
    loaded = EnsembleByKey.load(str(tmp_path / "derived"))
    assert loaded.getColNames() == ["mean(score)", "mean(other)"] and not loaded.isSet(loaded.colNames)

    stage.setColNames(["average-score", "average-other"])
    stage.write().save(str(tmp_path / "named"))
    loaded = EnsembleByKey.load(str(tmp_path / "named"))
    assert loaded.getColNames() == ["average-score", "average-other"] and loaded.isSet(loaded.colNames)
