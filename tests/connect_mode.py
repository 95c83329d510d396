"""Switching PySpark between classic and Spark Connect columns inside one test process."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def connect_mode():
    """Run a block as a Spark Connect client process would (PySpark's functions build Connect columns).

    PySpark decides between classic and Connect columns by one process-wide flag; the tests hold a
    classic and a Connect session in one process, so Connect code runs inside this block only
    (under ``pytest --connect`` the flag is on for the whole run).
    """
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
