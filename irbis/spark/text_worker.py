"""What a text stage's batch function runs in a Spark Python worker: the process's runner of the network, and
the batch's check of the rows that got no output.

The text stages (:mod:`irbis.ml.text_network`) refer to these, and to the kernels, by name: a Python worker
that unpickles a stage's function imports this module and the kernels it needs, not the stages' own modules
(which import ``pyspark.ml``; a worker that runs the network on ONNX Runtime or OpenVINO need not import
torch either).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["WorkerText", "check_reasons"]


class WorkerText:
    """In a worker: the process's runner (or tokenizer) of a text network, looked up at the first batch.

    Picklable and free of the stage object: a task ships the network's name, its source and the options.
    """

    def __init__(self, network: str, source: dict[str, Any], shipped: str | None, options: dict[str, Any],
                 what: str) -> None:
        self.network, self.source, self.shipped, self.options, self.what = network, source, shipped, options, what
        self._found: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_found": None}  # the runner stays in the process that loaded it

    def __call__(self) -> Any:
        """The runner (or tokenizer), looked up at the first batch and kept for the task's later batches."""
        if self._found is None:
            self._found = self._lookup()
        return self._found

    def _lookup(self) -> Any:
        from irbis.kernels.text_encoder import text_runner, text_tokens
        from irbis.models.text import TEXT_MODELS, text_source
        from irbis.spark.files import localize

        here = text_source(self.network) if self.network in TEXT_MODELS else dict(
            self.source, folder=localize(self.source["folder"], self.shipped))
        if self.what == "tokens":
            return text_tokens(here, self.options["max_length"])
        return text_runner(here, **self.options)


def check_reasons(errors: list[str | None], valid: np.ndarray, err_col: str) -> None:
    """Without an error column, the first row that has no output for a reason other than a null fails the batch."""
    if err_col:
        return
    for i, reason in enumerate(errors):
        if not valid[i] and reason and reason != "null text":
            raise ValueError(reason)
