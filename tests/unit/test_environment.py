"""Shipping Irbis's environment to executors: the Spark settings each kind of file gets, and the errors
named before any job starts."""

import pytest

from irbis.cli import build_parser
from irbis.spark.environment import ARCHIVE_ALIAS, environment_conf, merge_conf, python_version
from irbis.spark.session import get_spark


def test_a_pex_ships_through_spark_files_and_runs_as_the_executors_python(tmp_path):
    pex = tmp_path / "irbis-env.pex"
    pex.write_bytes(b"#!/usr/bin/env python3\n")
    conf, python = environment_conf(str(pex))
    assert conf == {"spark.files": str(pex)} and python == "./irbis-env.pex"


@pytest.mark.parametrize("name", ["env.tar.gz", "env.zip", "env.tgz"])
def test_a_packed_venv_ships_through_spark_archives_unpacked_under_an_alias(tmp_path, name):
    archive = tmp_path / name
    archive.write_bytes(b"")
    conf, python = environment_conf(f"file:{archive}")
    assert conf == {"spark.archives": f"file:{archive}#{ARCHIVE_ALIAS}"}
    assert python == f"./{ARCHIVE_ALIAS}/bin/python"


def test_cluster_storage_is_not_checked_here_but_a_missing_local_file_is_named(tmp_path):
    conf, python = environment_conf("hdfs://namenode/envs/irbis-env.pex")
    assert conf == {"spark.files": "hdfs://namenode/envs/irbis-env.pex"} and python == "./irbis-env.pex"
    missing = tmp_path / "nowhere.pex"
    with pytest.raises(FileNotFoundError, match="nowhere.pex.*irbis pack"):
        environment_conf(str(missing))
    other = tmp_path / "env.rpm"
    other.write_bytes(b"")
    with pytest.raises(ValueError, match="PEX file"):
        environment_conf(str(other))


def test_shipped_files_join_those_the_user_set():
    merged = merge_conf({"spark.files": "a.txt", "spark.x": "1"}, {"spark.files": "b.pex"})
    assert merged == {"spark.files": "a.txt,b.pex", "spark.x": "1"}
    assert merge_conf({}, {"spark.archives": "e.zip#e"}) == {"spark.archives": "e.zip#e"}


@pytest.mark.parametrize("master", ["local[2]", "local", "sc://127.0.0.1:15002"])
def test_an_environment_on_a_master_without_executors_of_their_own_is_refused(master, tmp_path):
    with pytest.raises(ValueError, match="environment= ships a Python environment"):
        get_spark(master, environment=str(tmp_path / "irbis-env.pex"))


def test_irbis_pack_takes_the_output_file():
    args = build_parser().parse_args(["pack", "--output", "out/env.pex"])
    assert args.output == "out/env.pex" and args.func.__module__ == "irbis.cli.pack" and not args.no_compress
    assert build_parser().parse_args(["pack", "--no-compress"]).no_compress  # the cluster tests ship such a PEX
    assert python_version().count(".") == 1


@pytest.mark.parametrize(("output", "suggested"), [("irbis-env.tar.gz", "irbis-env.pex"), ("out/env.zip", "env.pex"),
                                                   ("env", "env.pex")])
def test_irbis_pack_refuses_an_output_that_is_not_a_pex_before_building(tmp_path, capsys, output, suggested):
    from irbis.cli import main

    target = tmp_path / output
    assert main(["pack", "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"name the output {suggested!r}" in err and "PEX" in err
    assert list(tmp_path.iterdir()) == []  # refused before anything is built


def test_the_executors_python_given_in_conf_wins_over_any_an_earlier_session_set(tmp_path, monkeypatch):
    """PySpark's SparkContext reads the executors' Python from PYSPARK_PYTHON when it starts: get_spark puts
    there spark.pyspark.python when its conf has one, else the shipped environment's, else the user's own
    PYSPARK_PYTHON, else the driver's; what it set for an earlier session (stopped since) does not stay."""
    import os
    import sys

    from irbis.spark.session import _shipping

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    pex = tmp_path / "irbis-env.pex"
    pex.write_bytes(b"#!/usr/bin/env python3\n")

    def executors_python(conf, environment=None):
        settings = _shipping(dict(conf), environment, default_python=sys.executable)
        assert settings.get("spark.pyspark.python", os.environ["PYSPARK_PYTHON"]) == os.environ["PYSPARK_PYTHON"]
        return os.environ["PYSPARK_PYTHON"]

    assert executors_python({}) == sys.executable
    assert executors_python({"spark.pyspark.python": "/opt/irbis/bin/python"}) == "/opt/irbis/bin/python"
    assert executors_python({}, str(pex)) == "./irbis-env.pex"
    assert executors_python({}) == sys.executable  # the pack's Python went with the session that shipped it
    assert executors_python({"spark.pyspark.python": "/opt/py"}, str(pex)) == "/opt/py"
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3.11")  # the user's own
    assert executors_python({}) == "/usr/bin/python3.11"
    assert executors_python({"spark.pyspark.python": "/opt/py"}) == "/opt/py"
