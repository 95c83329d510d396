"""A value of the test run made in a daemon thread, started as soon as the run is known to need it (at
collection), so that its making overlaps the tests that run before the first one that needs it: the
standalone-cluster tests' PEX (``tests/cluster/conftest.py``), the camera-trap notebook's run
(``tests/conftest.py``). An interrupted run does not wait for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Background(threading.Thread):
    """``make()`` in a daemon thread named ``name``; :meth:`result` waits for its value or raises its error."""

    def __init__(self, name: str, make: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self.make, self.value, self.error = make, None, None
        self.start()

    def run(self) -> None:
        try:
            self.value = self.make()
        except BaseException as err:  # raised again in the test that needs the value
            self.error = err

    def result(self, timeout_s: float) -> Any:
        """The value, once made (at most ``timeout_s`` more seconds)."""
        self.join(timeout_s)
        if self.is_alive():
            raise TimeoutError(f"{self.name} did not end within {timeout_s:.0f} s")
        if self.error is not None:
            raise self.error
        return self.value
