"""Stages that hold callables by reference save them in one format and load them back."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from irbis.ml.basic import Lambda
from irbis.ml.estimator import TorchEstimator
from irbis.models.small import mlp


def _param_map(folder: Path) -> dict:
    return json.loads(next((folder / "metadata").glob("part-*")).read_text())["paramMap"]


def test_an_estimator_saves_its_callables_as_references_and_loads_them_back(spark, tmp_path):
    TorchEstimator(network=mlp, loss=torch.nn.functional.cross_entropy).save(str(tmp_path / "est"))
    assert {k: v for k, v in _param_map(tmp_path / "est").items() if k in ("network", "loss")} == \
        {"network": "irbis.models.small:mlp", "loss": "torch.nn.functional:cross_entropy"}
    loaded = TorchEstimator.load(str(tmp_path / "est"))
    assert loaded._resolved("network") is mlp
    assert loaded._resolved("loss") is torch.nn.functional.cross_entropy
    spec, strategy = loaded._spec()
    assert spec.network == {"kind": "factory", "factory": mlp} and strategy.name == "sync"


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

