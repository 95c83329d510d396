"""irbis.score and ``irbis score``: unit by unit, resumable after the driver dies, equal to one transform."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from irbis.ml.score import STATE, score

pytestmark = pytest.mark.spark

FILES, ROWS, WIDTH = 6, 8, 5


@pytest.fixture(scope="module")
def pipeline(spark):
    """A fitted pipeline: a TorchModel of a small MLP over the array column ``x``."""
    import torch
    from pyspark.ml import PipelineModel

    from irbis import TorchModel

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(WIDTH, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return PipelineModel([TorchModel.from_module(net, inputCol="x", outputCol="y")])


def _write_input(folder: Path, files: int = FILES, rows: int = ROWS) -> str:
    """``files`` Parquet files of ``rows`` rows each in ``folder``: ``id`` and the vector ``x``."""
    import pandas as pd

    rng = np.random.default_rng(1)
    folder.mkdir()
    for f in range(files):
        ids = range(f * rows, (f + 1) * rows)
        pd.DataFrame({"id": ids, "x": [rng.normal(size=WIDTH).tolist() for _ in ids]}).to_parquet(
            folder / f"part-{f}.parquet")
    return str(folder)


def _rows(spark, output: str) -> dict[int, np.ndarray]:
    """The scored rows of ``output``, by id; an id written twice fails."""
    frame = spark.read.parquet(output)
    assert "unit" in frame.columns
    rows = frame.select("id", "y").collect()
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "a row was written twice"
    return {r.id: np.asarray(r.y) for r in rows}


def _same(got: dict[int, np.ndarray], expected: dict[int, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6)


def _done(output: str) -> set[int]:
    """The units with a marker (its file committed)."""
    return {int(p.name.split("=")[1]) for p in (Path(output) / STATE / "done").glob("unit=*")
            if any(p.glob("part-*"))}


class Stop(RuntimeError):
    """The driver's death, in process."""


def _die(unit: int) -> None:
    raise Stop(f"the driver dies after unit {unit}")


def test_an_unbroken_run_writes_the_rows_of_one_transform(spark, pipeline, tmp_path):
    data = _write_input(tmp_path / "in")
    out = str(tmp_path / "out")
    result = score(pipeline, data, out, filesPerUnit=2, concurrency=2, showProgress=False, spark=spark)
    assert (result.units, sorted(result.scored), result.skipped) == (3, [0, 1, 2], 0)
    expected = {r.id: np.asarray(r.y) for r in pipeline.transform(spark.read.parquet(data)).collect()}
    assert len(expected) == FILES * ROWS
    _same(_rows(spark, out), expected)
    assert sorted(spark.read.parquet(out).columns) == ["id", "unit", "x", "y"]


def test_a_run_stopped_after_two_units_resumes_with_the_others_only(spark, pipeline, tmp_path):
    data = _write_input(tmp_path / "in")
    whole, out = str(tmp_path / "whole"), str(tmp_path / "out")
    score(pipeline, data, whole, filesPerUnit=1, showProgress=False, spark=spark)
    seen: list[int] = []

    def die(unit: int) -> None:
        seen.append(unit)
        if len(seen) == 2:
            raise Stop(f"the driver dies after unit {unit}")

    with pytest.raises(Stop):
        score(pipeline, data, out, filesPerUnit=1, concurrency=1, showProgress=False, spark=spark, afterUnit=die)
    done = _done(out)
    assert done == {0, 1}
    # what a unit cut short in its job's commit leaves: some of its files moved into place (here a copy of
    # another unit's), others still in _temporary, and no marker
    (Path(out) / "unit=00004").mkdir()
    part = next((Path(out) / "unit=00000").glob("part-*.parquet"))
    shutil.copy(part, Path(out) / "unit=00004" / part.name)
    assert _done(out) == {0, 1}
    result = score(pipeline, data, out, resume=True, showProgress=False, spark=spark)
    assert (result.units, result.skipped) == (FILES, 2)
    assert sorted(result.scored) == [2, 3, 4, 5]
    _same(_rows(spark, out), _rows(spark, whole))
    again = score(pipeline, data, out, resume=True, showProgress=False, spark=spark)
    assert (again.scored, again.skipped) == ((), FILES)


def test_resuming_over_a_changed_input_names_the_file(spark, pipeline, tmp_path):
    data = _write_input(tmp_path / "in", files=2)
    out = str(tmp_path / "out")
    with pytest.raises(Stop):
        score(pipeline, data, out, filesPerUnit=1, concurrency=1, showProgress=False, spark=spark,
              afterUnit=_die)
    changed = Path(data) / "part-1.parquet"
    changed.write_bytes(changed.read_bytes() + b"\0")
    with pytest.raises(ValueError, match=r"changed since .* planned: .*part-1.parquet was .*bytes.*--mode overwrite"):
        score(pipeline, data, out, resume=True, showProgress=False, spark=spark)
    shutil.copy(Path(data) / "part-0.parquet", Path(data) / "part-2.parquet")
    with pytest.raises(ValueError, match=r"part-2.parquet is new"):
        score(pipeline, data, out, resume=True, showProgress=False, spark=spark)


def test_an_existing_output_is_refused_without_resume_and_replaced_with_overwrite(spark, pipeline, tmp_path):
    data = _write_input(tmp_path / "in", files=2)
    out = str(tmp_path / "out")
    score(pipeline, data, out, showProgress=False, spark=spark)
    with pytest.raises(ValueError, match=r"--resume .*--mode overwrite"):
        score(pipeline, data, out, showProgress=False, spark=spark)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match=r"no run of irbis score planned.*--mode overwrite"):
        score(pipeline, data, str(other), showProgress=False, spark=spark)
    result = score(pipeline, data, str(other), mode="overwrite", showProgress=False, spark=spark)
    assert len(result.scored) == result.units == 2
    assert not (other / "notes.csv").exists()
    assert len(_rows(spark, str(other))) == 2 * ROWS


def test_a_pipeline_that_writes_a_column_unit_is_refused_before_a_plan_is_written(spark, tmp_path):
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import SQLTransformer

    data = _write_input(tmp_path / "in", files=2)
    clash = PipelineModel([SQLTransformer(statement="SELECT *, 1 AS unit FROM __THIS__")])
    with pytest.raises(ValueError, match="column 'unit'"):
        score(clash, data, str(tmp_path / "out"), showProgress=False, spark=spark)
    assert not (tmp_path / "out").exists()


@pytest.mark.classic_only(reason="the command runs on its own session from --master local[2]")
def test_the_command_scores_a_saved_pipeline_and_refuses_an_existing_output(spark, pipeline, tmp_path, capsys):
    from irbis.cli import main

    data = _write_input(tmp_path / "in", files=3)
    saved = str(tmp_path / "model")
    pipeline.write().save(saved)
    out = str(tmp_path / "out")
    assert main(["score", saved, data, out, "--files-per-unit", "2", "--master", "local[2]"]) == 0
    assert "scored 2 of 2 units" in capsys.readouterr().out
    expected = {r.id: np.asarray(r.y) for r in pipeline.transform(spark.read.parquet(data)).collect()}
    _same(_rows(spark, out), expected)
    assert main(["score", saved, data, out, "--master", "local[2]"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["score", saved, data, out, "--resume", "--master", "local[2]"]) == 0
    assert "scored 0 of 2 units" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.classic_only(reason="a process of its own, on its own classic session")
def test_a_driver_killed_at_seventy_percent_resumes_to_the_unbroken_output(spark, pipeline, tmp_path):
    data = _write_input(tmp_path / "in", files=10, rows=4)
    saved = str(tmp_path / "model")
    pipeline.write().save(saved)
    out = str(tmp_path / "out")
    command = [sys.executable, "-m", "irbis.cli", "score", saved, data, out, "--files-per-unit", "1",
               "--concurrency", "1", "--master", "local[1]"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while len(_done(out)) < 7 and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    killed_at = _done(out)
    assert 1 <= len(killed_at) < 10, "the run was not killed part way"
    result = score(saved, data, out, resume=True, showProgress=False, spark=spark)
    assert sorted(result.scored) == sorted(set(range(10)) - killed_at)
    expected = {r.id: np.asarray(r.y) for r in pipeline.transform(spark.read.parquet(data)).collect()}
    _same(_rows(spark, out), expected)
