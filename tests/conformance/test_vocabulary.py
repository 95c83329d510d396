"""Every public stage follows Irbis's one vocabulary (irbis.ml.vocabulary), in the style of scikit-learn's
estimator checks: driven by the table and by ``irbis.ml.__all__``, so a stage added later is checked too.

- no Param of a stage goes by a name the vocabulary avoids (another name of one of its
  concepts): the concept's Param carries the vocabulary's name;
- every Param has Spark ML's ``setX`` and ``getX``, and a value set reads back;
- each SynapseML name (``SYNAPSEML_ALIASES``) has its setter and getter and reads the Irbis Param's default;
- each Estimator declares its one Model class (``_model_class``), which the stage harness checks against
  what the estimator fits (test_stages.fit_stage);
- a stage that writes ``rawPredictionCol``, ``probabilityCol`` and ``predictionCol`` means by them what
  Spark ML's classifiers do.
"""
from __future__ import annotations

import math

import pytest
from pyspark.ml import Estimator, Model, Transformer

import irbis.ml
from irbis.ml.params import accessor_names
from irbis.ml.vocabulary import CLASSIFIER_OUTPUTS, VOCABULARY, avoided_names
from stage_cases import STAGE_CASES
from test_stages import fit_stage


def _public_stages() -> list[type]:
    return [obj for name in irbis.ml.__all__ if isinstance(obj := getattr(irbis.ml, name), type)
            and issubclass(obj, Transformer | Estimator)]


STAGES = {cls.__name__: cls for cls in _public_stages()}


def test_the_vocabulary_names_each_concept_once():
    names = [t.name for t in VOCABULARY]
    assert len(set(names)) == len(names)
    clashes = set(names) & set(avoided_names())
    assert not clashes, f"names both used and avoided by the vocabulary: {sorted(clashes)}"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_params_use_the_vocabulary_names(name):
    stage = STAGES[name]()
    avoided = avoided_names()
    wrong = {p.name: avoided[p.name] for p in stage.params if p.name in avoided}
    assert not wrong, f"{name}: Params named other than the vocabulary names them (found -> vocabulary): {wrong}"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_param_has_its_setter_and_getter(name):
    stage = STAGES[name]()
    for param in stage.params:
        set_name, get_name = accessor_names(param.name)
        assert callable(getattr(stage, set_name, None)), f"{name}.{set_name} is missing"
        assert callable(getattr(stage, get_name, None)), f"{name}.{get_name} is missing"
        if stage.hasDefault(param) and stage.getOrDefault(param) is not None:
            value = stage.getOrDefault(param)
            copy = stage.copy()
            assert getattr(copy, set_name)(value) is copy, f"{name}.{set_name} does not return the stage"
            assert getattr(copy, get_name)() == value and copy.isSet(param.name)


@pytest.mark.parametrize("name", sorted(n for n, c in STAGES.items() if getattr(c, "SYNAPSEML_ALIASES", ())))
def test_synapseml_names_set_and_read_the_irbis_params(name):
    stage = STAGES[name]()
    params = {p.name for p in stage.params}
    for alias in type(stage).SYNAPSEML_ALIASES:
        assert alias.target in params, f"{name}: SynapseML's {alias.name} aliases no Param ({alias.target})"
        assert alias.name == alias.target or alias.name not in params, f"{name}: {alias.name} is a second Param"
        set_name, get_name = accessor_names(alias.name)
        assert callable(getattr(stage, set_name)) and callable(getattr(stage, get_name))
        if stage.hasDefault(alias.target) and stage.getOrDefault(alias.target) is not None:
            assert getattr(stage, get_name)() == alias.from_irbis(stage.getOrDefault(alias.target))


ESTIMATORS = sorted(n for n, c in STAGES.items() if issubclass(c, Estimator))


@pytest.mark.parametrize("name", ESTIMATORS)
def test_each_estimator_declares_its_model_class(name):
    declared = getattr(STAGES[name], "_model_class", None)
    assert isinstance(declared, type) and issubclass(declared, Model), \
        f"{name} declares no Model class (_model_class)"
    if name in STAGE_CASES and STAGE_CASES[name].fitted:
        assert declared.__name__ == STAGE_CASES[name].fitted


#: The stage cases whose stage writes all three classifier outputs.
CLASSIFIERS = sorted(n for n, case in STAGE_CASES.items()
                     if all(case.make_stage().hasParam(p) for p in CLASSIFIER_OUTPUTS))


def test_the_classifier_check_has_stages_to_check():
    assert {"ImageClassifier", "ImageClassifierModel"} <= set(CLASSIFIERS)


@pytest.mark.spark
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_outputs_mean_what_spark_ml_means(spark, name):
    """rawPrediction (scores), probability (softmax, sums to 1) and prediction (their argmax, a double)."""
    case = STAGE_CASES[name]
    df = case.make_frame(spark)
    model = fit_stage(case, df)[1]
    raw_col, prob_col, pred_col = (model.getOrDefault(p) for p in CLASSIFIER_OUTPUTS)
    rows = [r for r in model.transform(df).select(raw_col, prob_col, pred_col).collect() if r[0] is not None]
    assert rows, f"{name}: no scored rows"
    for raw, prob, pred in rows:
        scores, probs = raw.toArray(), prob.toArray()
        assert isinstance(pred, float) and len(scores) == len(probs)
        assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-5)
        assert int(pred) == int(scores.argmax()) == int(probs.argmax())
        exp = [math.exp(s - scores.max()) for s in scores]
        assert all(math.isclose(p, e / sum(exp), rel_tol=1e-4, abs_tol=1e-6) for p, e in zip(probs, exp))
