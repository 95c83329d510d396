"""Skip the ``notebooks`` tests under ``--connect``: each notebook starts a classic Spark driver of its own."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    if config.getoption("--connect"):
        skip = pytest.mark.skip(reason="each notebook starts a classic Spark driver of its own")
        for item in items:
            if item.get_closest_marker("notebooks") is not None:
                item.add_marker(skip)
