"""A saved pipeline compiled into a chain of batch kernels: the request path, with no Spark job.

:func:`load_predictor` reads a saved ``PipelineModel`` (or one stage) with
:func:`irbis.ml.kernel_pipeline.load_local` and gives a :class:`Predictor`: the same
:data:`~irbis.kernels.blocks.BatchFn` kernels that the stages run on Spark (Irbis stages'
:meth:`kernel`, and the SparkML stages of :data:`~irbis.kernels.sparkml.SPARKML_KERNELS`), run one after
another by :func:`~irbis.kernels.blocks.run_steps`. A stage without a kernel is refused by name
(:class:`irbis.errors.NoKernelError`), unless ``spark`` names a master: then the whole pipeline runs
through an embedded Spark session (:class:`~irbis.serving.spark_predictor.SparkPredictor`), a slower path.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from irbis.errors import NoKernelError
from irbis.kernels.blocks import Images, rows_in, run_steps
from irbis.kernels.sparkml_state import ANY_VALUE, KINDS, StageKernel
from irbis.ml.kernel_pipeline import load_local
from irbis.serving.codecs import check_outputs, json_rows
from irbis.serving.spark_predictor import SparkPredictor

__all__ = ["KINDS", "Predictor", "compile_stages", "json_rows", "load_predictor"]

LOG = logging.getLogger("irbis.serving")


class Predictor:
    """Kernels run in sequence over the columns of a batch of rows.

    Attributes
    ----------
    inputs : dict of str to set of str
        The columns a request must give, each with the kinds of value it accepts (:data:`KINDS`).
    nullable : dict of str to bool
        Whether a column may be null (or NaN); ``False`` where a stage would fail on it.
    outputs : list of str
        The columns a response carries: the ``outputs`` asked for, ``["all"]`` for every column the
        kernels write, or by default the last kernel's (the last stage's) output columns.
    """

    slow = False

    def __init__(self, kernels: list[StageKernel], inputs: dict[str, set[str]],
                 nullable: dict[str, bool], outputs: Sequence[str] | None = None) -> None:
        self.kernels = kernels
        self.inputs, self.nullable = inputs, nullable
        produced = [c for k in kernels for c in k.outputs]
        self.outputs = check_outputs(produced, outputs, kernels[-1].outputs if kernels else [])

    def predict(self, columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Run the pipeline on decoded column values (images as ``(H, W, C)`` arrays); JSON-ready rows."""
        ragged = frozenset(c for k in self.kernels for c in k.ragged)
        blocks = {c: Images.from_arrays(v) if _are_images(v) else rows_in(v, c, c in ragged)
                  for c, v in columns.items()}
        out = run_steps([(k.inputs, k.fn) for k in self.kernels], blocks)
        return {c: json_rows(out[c]) for c in self.outputs}


def _are_images(values: list[Any]) -> bool:
    """Decoded images are integer (H, W, C) arrays; vectors from JSON are float64."""
    return any(isinstance(v, np.ndarray) and v.dtype.kind == "u" for v in values)


def compile_stages(path: str, outputs: Sequence[str] | None = None) -> Predictor:
    """The :class:`Predictor` of the pipeline saved in ``path``, answering with ``outputs`` (default: the last
    stage's output columns; ``["all"]``: every column); :class:`NoKernelError` naming the stages without a
    kernel."""
    try:
        kernels = load_local(path)
    except NoKernelError as err:
        raise NoKernelError(err.classes, f"{err}; serve the pipeline through an embedded Spark session "
                                         "instead (--master local[*], slower)") from None
    inputs: dict[str, set[str]] = {}
    nullable: dict[str, bool] = {}
    produced: set[str] = set()
    for kernel in kernels:
        for column in kernel.inputs:
            if column not in produced:
                kinds = set(kernel.kinds.get(column) or ANY_VALUE)
                inputs[column] = inputs[column] & kinds if column in inputs else kinds
                nullable[column] = nullable.get(column, True) and kernel.nulls
        produced |= set(kernel.outputs)
    return Predictor(kernels, inputs, nullable, outputs)


def load_predictor(path: str, outputs: Sequence[str] | None = None, spark: str | None = None) -> Predictor:
    """A predictor for the pipeline saved in ``path`` (see the module docstring), answering with ``outputs``:
    by default the last stage's output columns (a classifier's ``rawPrediction``, ``probability`` and
    ``prediction``, not the feature vectors before it), ``["all"]`` for every column the pipeline writes.

    Raises
    ------
    ValueError
        ``outputs`` names a column the pipeline does not write (the message lists those it writes).
    """
    try:
        return compile_stages(path, outputs)
    except NoKernelError as err:
        if spark is None:
            raise
        LOG.warning("%s; serving through Spark %s: every batch is a Spark job (slower)", err, spark)
    return SparkPredictor(path, spark, outputs)
