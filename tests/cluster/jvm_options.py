"""The tests' JVM options (``SPARK_SUBMIT_OPTS``, set in ``tests/conftest.py``) carried to the standalone
cluster's processes: :func:`irbis.spark.standalone.process_env` rightly strips ``SPARK_*`` from a cluster
process's environment, so a test gives them back to the driver process it starts, and the driver passes them
on to its executors."""

from __future__ import annotations

import os


def with_test_jvm_options(env: dict[str, str]) -> dict[str, str]:
    """``env`` (a driver process's environment) with the tests' JVM options."""
    return {**env, "SPARK_SUBMIT_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", "")}


def executor_jvm_options() -> dict[str, str]:
    """The session setting that starts the executors' JVMs as the driver's (read in the driver process)."""
    return {"spark.executor.extraJavaOptions": os.environ.get("SPARK_SUBMIT_OPTS", "")}
