"""``irbis[mlflow]`` is enough for MLflow's defaults: a run started with no tracking URI set opens MLflow's
default store, a SQLite database in the working folder, which the skinny client alone cannot open."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]


def mlflow_extra() -> dict[str, Requirement]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {Requirement(r).name.lower(): Requirement(r) for r in extras["mlflow"]}


def test_the_extra_holds_what_the_default_sqlite_store_imports_and_the_constraints_pin_it():
    # mlflow-skinny registers its SQL stores only where sqlalchemy imports; they migrate with alembic.
    extra = mlflow_extra()
    assert {"mlflow-skinny", "sqlalchemy", "alembic"} <= set(extra)
    pinned = {line.split("==")[0].lower() for line in (ROOT / "constraints.txt").read_text().split()}
    assert set(extra) <= pinned


def test_a_run_on_mlflows_defaults_logs_into_the_sqlite_store(tmp_path):
    pytest.importorskip("mlflow")
    code = ("import mlflow\n"
            "with mlflow.start_run() as run:\n"
            "    mlflow.log_metric('loss', 0.5)\n"
            "print(mlflow.get_tracking_uri()); print(mlflow.get_run(run.info.run_id).data.metrics['loss'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    uri, loss = done.stdout.split()[-2:]
    assert uri.startswith("sqlite:") and (tmp_path / "mlflow.db").is_file() and float(loss) == 0.5
