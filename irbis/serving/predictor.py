"""A saved pipeline compiled into a chain of batch kernels: the request path, with no Spark job.

:func:`load_predictor` reads a saved ``PipelineModel`` (or one stage) with
:func:`irbis.ml.kernel_pipeline.local_chain` and gives a :class:`Predictor`: the same
:data:`~irbis.kernels.blocks.BatchFn` kernels that the stages run on Spark (Irbis stages'
:meth:`kernel`, and the SparkML stages of :data:`~irbis.kernels.sparkml.stage_kernels.SPARKML_KERNELS`), run one after
another by :class:`~irbis.kernels.chain.KernelChain`. A stage without a kernel is refused by name
(:class:`irbis.errors.NoKernelError`), unless ``spark`` names a master: then the whole pipeline runs
through an embedded Spark session (:class:`~irbis.serving.spark_predictor.SparkPredictor`), a slower path,
whose request columns come from the same chain.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from irbis.errors import NoKernelError
from irbis.kernels.blocks import Images, rows_in
from irbis.kernels.chain import KINDS, KernelChain
from irbis.kernels.sequences import length_batches
from irbis.ml.kernel_pipeline import local_chain
from irbis.serving.codecs import check_outputs, json_rows
from irbis.serving.spark_predictor import SparkPredictor

__all__ = ["KINDS", "Predictor", "compile_stages", "json_rows", "load_predictor"]

LOG = logging.getLogger("irbis.serving")

#: What a pipeline with a stage that has no kernel can do instead.
_SPARK_HINT = "serve the pipeline through an embedded Spark session instead (--master local[*], slower)"


class Predictor:
    """A chain of kernels run over the columns of a batch of rows.

    Attributes
    ----------
    chain : KernelChain
        The stages' kernels.
    inputs : dict of str to set of str
        The columns a request must give, each with the kinds of value it accepts (:data:`KINDS`).
    nullable : dict of str to bool
        Whether a column may be null (or NaN); ``False`` where a stage would fail on it.
    outputs : list of str
        The columns a response carries: the ``outputs`` asked for, ``["all"]`` for every column the
        kernels write, or by default the last kernel's (the last stage's) output columns.
    """

    slow = False

    def __init__(self, chain: KernelChain, outputs: Sequence[str] | None = None) -> None:
        chain.kernels()  # every stage has one
        self.chain = chain
        self.inputs = {c: set(k) for c, k in chain.inputs.items()}
        self.nullable = dict(chain.nullable)
        self.outputs = check_outputs(chain.outputs, outputs, chain.last_outputs)

    def length_groups(self, requests: Sequence[dict[str, list[Any]]]) -> list[list[int]]:
        """The requests (their indices) in groups, one pipeline call each, shortest first.

        Where a stage batches a request column by length (:attr:`KernelChain.lengths`), the requests are
        sorted by their longest value there and cut so that a group's rows times its padded longest stay
        within the stage's token budget (:func:`~irbis.kernels.sequences.length_batches`; a request is never
        split, and one over the budget is a group alone). Otherwise, and for one request, one group.
        """
        rule = self.chain.lengths
        if rule is None or len(requests) < 2:
            return [list(range(len(requests)))]
        values = [r.get(rule.column) or [] for r in requests]
        measured = rule.measure([v for vs in values for v in vs])
        ends = np.cumsum([len(vs) for vs in values])
        longest = np.array([measured[e - len(vs):e].max(initial=0) for vs, e in zip(values, ends)], np.int64)
        rows = np.array([max(1, len(vs)) for vs in values], np.int64)
        return [b.tolist() for b in length_batches(longest, token_budget=rule.budget, max_rows=int(rows.sum()),
                                                   rows=rows)]

    def predict(self, columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Run the pipeline on decoded column values (images as ``(H, W, C)`` arrays); JSON-ready rows."""
        ragged = self.chain.ragged
        blocks = {c: Images.from_arrays(v) if _are_images(v) else rows_in(v, c, c in ragged)
                  for c, v in columns.items()}
        out = self.chain.run(blocks)
        return {c: json_rows(out[c]) for c in self.outputs}


def _are_images(values: list[Any]) -> bool:
    """Decoded images are integer (H, W, C) arrays; vectors from JSON are float64."""
    return any(isinstance(v, np.ndarray) and v.dtype.kind == "u" for v in values)


def _compiled(chain: KernelChain, outputs: Sequence[str] | None) -> Predictor:
    """The :class:`Predictor` of ``chain``; :class:`NoKernelError` naming the stages without a kernel."""
    try:
        chain.kernels()
    except NoKernelError as err:
        raise NoKernelError(err.classes, f"{err}; {_SPARK_HINT}") from None
    return Predictor(chain, outputs)


def compile_stages(path: str, outputs: Sequence[str] | None = None) -> Predictor:
    """The :class:`Predictor` of the pipeline saved in ``path``, answering with ``outputs`` (default: the last
    stage's output columns; ``["all"]``: every column); :class:`NoKernelError` naming the stages without a
    kernel."""
    return _compiled(local_chain(path), outputs)


def load_predictor(path: str, outputs: Sequence[str] | None = None,
                   spark: str | None = None) -> Predictor | SparkPredictor:
    """A predictor for the pipeline saved in ``path`` (see the module docstring), answering with ``outputs``:
    by default the last stage's output columns (a classifier's ``rawPrediction``, ``probability`` and
    ``prediction``, not the feature vectors before it), ``["all"]`` for every column the pipeline writes.

    Raises
    ------
    ValueError
        ``outputs`` names a column the pipeline does not write (the message lists those it writes).
    """
    chain = local_chain(path)
    try:
        return _compiled(chain, outputs)
    except NoKernelError as err:
        if spark is None:
            raise
        LOG.warning("%s; serving through Spark %s: every batch is a Spark job (slower)", err, spark)
    return SparkPredictor(path, spark, outputs, chain)
