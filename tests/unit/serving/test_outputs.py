"""Which columns a served pipeline answers with: by default its last stage's outputs, ``all`` for every
column it writes, or the ones named.

The pipeline is saved and read without a JVM: the StandardScaler and LogisticRegression stages of the
saved pipeline of tests/data/saved_stages, as a 2-stage ``PipelineModel`` of their own.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from irbis.cli import main
from irbis.serving.codecs import check_outputs
from irbis.serving.predictor import load_predictor
from irbis.serving.server import BackgroundServer, build_app

SAVED = Path(__file__).resolve().parents[2] / "data" / "saved_stages" / "tabular_pipeline"
#: The stages' folders, in their order: StandardScaler, then LogisticRegression.
FOLDERS = [next((SAVED / "stages").glob(f"*_{name}_*")) for name in ("StandardScaler", "LogisticRegression")]
LAST = ["rawPrediction", "probability", "prediction"]  # the classifier's columns
EVERY = ["scaled", *LAST]
ROWS = [{"features": [0.5, -1.0, 2.0]}, {"features": [-0.2, 0.3, 0.1]}]


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory) -> str:
    """A saved PipelineModel: StandardScaler (features -> scaled), then LogisticRegression (scaled -> its three)."""
    folder = tmp_path_factory.mktemp("two_stages") / "model"
    (folder / "metadata").mkdir(parents=True)
    metadata = {"class": "pyspark.ml.pipeline.PipelineModel", "timestamp": 0, "sparkVersion": "4.3.0",
                "uid": "PipelineModel_two", "defaultParamMap": {},
                "paramMap": {"stageUids": [f.name.split("_", 1)[1] for f in FOLDERS], "language": "Python"}}
    (folder / "metadata" / "part-00000").write_text(json.dumps(metadata) + "\n")
    for i, source in enumerate(FOLDERS):
        shutil.copytree(source, folder / "stages" / f"{i}_{source.name.split('_', 1)[1]}")
    return str(folder)


def _answer(path: str, outputs=None) -> list[dict]:
    with BackgroundServer(build_app(path, outputs)) as url:
        answer = httpx.post(f"{url}/predict", json=ROWS, timeout=30)
        ready = httpx.get(f"{url}/ready").json()
        doc = httpx.get(f"{url}/openapi.json").json()
    assert answer.status_code == 200, answer.text
    schema = doc["paths"]["/predict"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ready["outputs"] == schema["oneOf"][0]["required"] == list(answer.json()[0])
    return answer.json()


def test_the_default_is_the_last_stages_outputs(two_stages):
    assert load_predictor(two_stages).outputs == LAST
    answer = _answer(two_stages)
    assert [list(row) for row in answer] == [LAST, LAST]  # no "scaled": the vector before the classifier
    assert all(row["prediction"] in (0.0, 1.0) and abs(sum(row["probability"]) - 1) < 1e-9 for row in answer)


def test_all_answers_with_every_column(two_stages):
    assert load_predictor(two_stages, ["all"]).outputs == EVERY
    every = _answer(two_stages, ["all"])
    assert [list(row) for row in every] == [EVERY, EVERY]
    assert [{c: row[c] for c in LAST} for row in every] == _answer(two_stages)  # the same answers, and more


def test_named_outputs_are_the_answer(two_stages):
    assert load_predictor(two_stages, ["prediction", "scaled"]).outputs == ["prediction", "scaled"]
    answer = _answer(two_stages, ["prediction"])
    assert [list(row) for row in answer] == [["prediction"], ["prediction"]]


def test_an_unknown_output_names_the_columns_there_are(two_stages):
    with pytest.raises(ValueError) as refused:
        load_predictor(two_stages, ["prediction", "nope"])
    message = str(refused.value)
    assert "['nope']" in message and str(EVERY) in message and "--outputs all" in message


def test_the_command_line_passes_outputs_on(two_stages, monkeypatch):
    seen = []
    monkeypatch.setattr("irbis.serving.server.serve", lambda path, **kw: seen.append(kw["outputs"]))
    for flag in ([], ["--outputs", "all"], ["--outputs", "prediction,probability"]):
        assert main(["serve", two_stages, *flag]) == 0
    assert seen == [None, ["all"], ["prediction", "probability"]]
    assert [check_outputs(EVERY, s, LAST) for s in seen] == [LAST, EVERY, ["prediction", "probability"]]


def test_help_says_what_the_default_is(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "'all' for every column the pipeline writes" in text and "the last stage's output columns" in text


def test_check_outputs():
    assert check_outputs(["a", "b", "b"], None, ["b"]) == ["b"]
    assert check_outputs(["a", "b", "b"], [], []) == ["a", "b"]  # a last stage that writes nothing: all
    assert check_outputs(["a", "b", "b"], ["all"], ["b"]) == ["a", "b"]
    assert check_outputs(["a", "b"], ["b", "a", "b"], ["b"]) == ["b", "a"]
