"""One declaration per Param, per stage (irbis.ml.params): each Param of a public stage is declared by one row,
given its default in one place, and everything else (the accessors, ``__init__`` and ``setParams``) is made
from that declaration."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from pyspark.ml.param import Param, Params

import irbis.ml
from irbis.ml.params import declared_defaults, stage_signature

ROOT = Path(__file__).resolve().parents[2]


def _public_stages() -> list[type]:
    stages = [getattr(irbis.ml, name) for name in irbis.ml.__all__]
    return [s for s in stages if isinstance(s, type) and issubclass(s, Params)]


STAGES = _public_stages()


def _declarations(cls: type) -> dict[str, list[str]]:
    """Param name -> the classes of ``cls``'s MRO whose own namespace declares it."""
    found: dict[str, list[str]] = {}
    for klass in cls.__mro__:
        for value in vars(klass).values():
            if isinstance(value, Param):
                found.setdefault(value.name, []).append(klass.__qualname__)
    return found


def test_the_public_stages_are_all_here():
    assert len(STAGES) >= 30


@pytest.mark.parametrize("cls", STAGES, ids=lambda c: c.__name__)
def test_each_param_is_declared_once(cls: type):
    twice = {name: where for name, where in _declarations(cls).items() if len(where) > 1}
    assert not twice, f"{cls.__name__}: Params declared by more than one class: {twice}"


@pytest.mark.parametrize("cls", STAGES, ids=lambda c: c.__name__)
def test_a_stage_default_overrides_a_param_of_its_own_and_says_something_new(cls: type):
    names = {p.name for p in cls().params}
    for klass in cls.__mro__:
        own = vars(klass).get("_defaults", {})
        assert set(own) <= names, f"{klass.__qualname__}._defaults names no Param: {set(own) - names}"
        inherited: dict = {}  # what the stage's defaults would be without this class's _defaults
        for other in reversed(cls.__mro__):
            inherited.update(vars(other).get("_row_defaults", {}))
            inherited.update(vars(other).get("_defaults", {}) if other is not klass else {})
        same = {n for n, v in own.items() if n in inherited and inherited[n] == v}
        assert not same, f"{klass.__qualname__}._defaults repeats the default it inherits for {same}"


@pytest.mark.parametrize("cls", STAGES, ids=lambda c: c.__name__)
def test_the_signatures_list_every_param_with_its_one_default(cls: type):
    stage, declared = cls(), declared_defaults(cls)
    for param in stage.params:  # the declared default is the stage's (PySpark's mixins give some others)
        if param.name in declared:
            assert stage.getOrDefault(param) == declared[param.name], (cls.__name__, param.name)
    for method in (cls, cls.__init__, cls.setParams):
        keywords = {n: p for n, p in inspect.signature(method).parameters.items() if n != "self"}
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keywords.values())
        assert {n: keywords[n].default for n in keywords if n in declared} == {
            n: declared[n] for n in keywords if n in declared}
        params = {p.name for p in stage.params}
        assert params <= set(keywords), f"{cls.__name__}: keywords lack {params - set(keywords)}"
        extra = set(keywords) - params
        aliases = {a.name for a in getattr(cls, "SYNAPSEML_ALIASES", ())} | set(getattr(cls, "_extra_keywords", ()))
        assert extra <= aliases, f"{cls.__name__}: keywords that are neither Params nor declared extras: {extra}"


def test_a_stage_made_by_keywords_sets_what_was_given_and_defaults_the_rest():
    from irbis.ml import TextEmbedder

    stage = TextEmbedder(inputCol="review", maxLength=128)
    assert stage.isSet("inputCol") and stage.isSet("maxLength") and not stage.isSet("outputCol")
    assert stage.getOutputCol() == "embedding" and stage.getMiniBatchSize() == 256
    assert stage.setParams(outputCol="e").getOutputCol() == "e" and stage.isSet("outputCol")
    with pytest.raises(TypeError, match=r"unknown arguments \['maxLen'\]"):
        TextEmbedder(maxLen=3)


def test_a_stage_module_sets_no_default_by_hand():
    """No stage module calls ``_setDefault`` or writes its own ``__init__``/``setParams`` for Params: the
    generated ones (irbis.ml.params) are the only ones."""
    offenders = []
    for path in sorted((ROOT / "irbis" / "ml").glob("*.py")):
        if path.name == "params.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_setDefault":
                offenders.append(f"{path.name}:{node.lineno} _setDefault")
            if isinstance(node, ast.Name) and node.id == "keyword_only":
                offenders.append(f"{path.name}:{node.lineno} keyword_only")
    for cls in STAGES:
        for klass in cls.__mro__:
            if not klass.__module__.startswith("irbis."):
                continue
            for name in ("__init__", "setParams"):
                method = vars(klass).get(name)
                if method is not None and not method.__code__.co_filename.endswith("params.py"):
                    offenders.append(f"{klass.__qualname__}.{name}")
    assert not offenders, offenders


def test_a_check_declared_in_a_row_refuses_what_it_should():
    from irbis.errors import ParamValueError
    from irbis.ml import TextFeaturizer

    for name, bad in (("numFeatures", 0), ("nGramLength", 0), ("minTokenLength", -1), ("minDocFreq", -1)):
        with pytest.raises(ParamValueError, match=name):
            TextFeaturizer(**{name: bad})
    assert TextFeaturizer(minDocFreq=0).getMinDocFreq() == 0


def test_the_signature_is_the_one_a_class_gives_inspect():
    from irbis.ml import Repartition

    sig = stage_signature(Repartition)
    assert str(sig) == "(self, *, numPartitions=2, partitionCols=[]) -> None"
    assert inspect.signature(Repartition).parameters.keys() == {"numPartitions", "partitionCols"}
