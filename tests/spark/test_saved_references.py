"""Stages that hold callables by reference save them in one format and still load the older one."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from irbis.ml.basic import Lambda
from irbis.ml.estimator import TorchEstimator
from irbis.models.small import mlp

OLD = Path(__file__).parents[1] / "data" / "saved_refs_v0" / "torch_estimator"


def _param_map(folder: Path) -> dict:
    return json.loads(next((folder / "metadata").glob("part-*")).read_text())["paramMap"]


def test_an_estimator_saved_with_python_prefixed_references_loads_and_saves_them_in_the_one_format(spark, tmp_path):
    assert _param_map(OLD)["network"] == "python:irbis.models.small:mlp"
    loaded = TorchEstimator.load(str(OLD))
    assert loaded._resolved("network") is mlp
    assert loaded._resolved("loss") is torch.nn.functional.cross_entropy
    spec, strategy = loaded._spec()
    assert spec.network == {"kind": "factory", "factory": mlp} and strategy.name == "sync"
    loaded.save(str(tmp_path / "again"))
    assert {k: v for k, v in _param_map(tmp_path / "again").items() if k in ("network", "loss")} == \
        {"network": "irbis.models.small:mlp", "loss": "torch.nn.functional:cross_entropy"}
    fresh = TorchEstimator(network=mlp, loss=torch.nn.functional.cross_entropy)
    assert fresh.getOrDefault("network") == "irbis.models.small:mlp"


def test_a_lambda_and_an_estimator_share_the_format_and_the_reasons_for_refusing(spark, tmp_path):
    stage = Lambda(function=mlp)
    assert stage.getOrDefault("function") == TorchEstimator(network=mlp).getOrDefault("network")
    est = TorchEstimator(network=lambda: torch.nn.Linear(64, 10))
    try:
        est.save(str(tmp_path / "no"))
    except ValueError as err:
        assert "['network'] cannot be saved" in str(err) and "lambda" in str(err)
    else:
        raise AssertionError("an estimator holding a lambda saved")

