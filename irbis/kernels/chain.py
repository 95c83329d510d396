"""The seam between a stage and what runs it: one stage as a kernel (:class:`StageKernel`), and a chain of
stages run one after another: the columns it reads from outside (with the kinds of value each accepts), the
columns it writes, and running it on blocks.

Serving's :class:`~irbis.serving.predictor.Predictor`, the Spark fall-back's input discovery, ``fuse``'s
:class:`~irbis.ml.fused.FusedStages` and LIME's local scoring each build one :class:`KernelChain` from their
stages' :class:`StageKernel` (or, for a stage with no kernel, its
:class:`StageColumns`).

Examples
--------
>>> double = StageKernel(["x"], ["y"], lambda b: {"y": b["x"] * 2}, kinds={"x": frozenset({"number"})})
>>> add = StageKernel(["y", "z"], ["w"], lambda b: {"w": b["y"] + b["z"]})
>>> chain = KernelChain([double, add])
>>> list(chain.inputs), chain.outputs, sorted(chain.consumed)
(['x', 'z'], ['y', 'w'], ['y'])
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence, Union

import numpy as np

from irbis.errors import NoKernelError
from irbis.kernels.blocks import BatchFn, run_steps

__all__ = ["ANY_VALUE", "KINDS", "ChainKernel", "KernelChain", "LengthRule", "StageColumns", "StageKernel"]


#: Kinds of value an input column may hold, as a runtime without Spark sees them: a number, a vector
#: (an array of numbers), a string, or an image (decoded pixels, or the bytes of an encoded file).
KINDS = ("number", "vector", "string", "image")
#: What an input column accepts where its stage declares nothing: any value but an image.
ANY_VALUE = frozenset({"number", "vector", "string"})


@dataclass(frozen=True)
class LengthRule:
    """How a stage that batches its rows by length measures them: ``measure`` gives the length (tokens) of
    each value of the input ``column``, as the stage will batch it, and ``budget`` is the stage's token
    budget (:func:`irbis.kernels.sequences.length_batches`). A server uses it to cut a drain of requests
    into length groups (:class:`irbis.serving.batcher.Batcher`)."""

    column: str
    measure: Callable[[list[Any]], np.ndarray]
    budget: int


@dataclass
class StageKernel:
    """A stage as a kernel: the columns it reads, the columns it writes, and its batch function.

    ``kinds`` gives, for each input column, the :data:`KINDS` the stage accepts there (declared by the
    stage); ``types`` gives each output column's Spark type (a ``pyspark.sql.types.DataType``) where the
    stage's layer knows it. ``drops_rows`` is true for a stage that removes rows
    (``handleInvalid="skip"``): its kernel gives nulls at those rows, and a runtime that serves rows
    drops the rows where any output is null. ``nulls`` is false for a stage that fails on a null (or
    NaN) input, so that a runtime can refuse one up front. ``ragged`` names the input columns read as
    sequences of varying length (:func:`irbis.kernels.blocks.rows_in` with ``ragged=True``). ``lengths`` is
    set by a stage that batches its rows by length (:class:`LengthRule`).
    """

    inputs: list[str]
    outputs: list[str]
    fn: BatchFn
    drops_rows: bool = False
    nulls: bool = True
    kinds: dict[str, frozenset[str]] = field(default_factory=dict)
    types: dict[str, Any] = field(default_factory=dict)
    ragged: frozenset[str] = frozenset()
    lengths: LengthRule | None = None


@dataclass
class StageColumns:
    """What a stage reads and writes, without a batch function: a stage that has no kernel (it runs only in
    Spark), or one whose kernel is not built yet. The fields mean what :class:`StageKernel`'s do; ``name``
    is the stage's class and ``uid`` its uid where known."""

    name: str
    inputs: list[str]
    outputs: list[str]
    kinds: dict[str, frozenset[str]] = field(default_factory=dict)
    types: dict[str, Any] = field(default_factory=dict)
    nulls: bool = True
    ragged: frozenset[str] = frozenset()
    uid: str = ""


Step = Union[StageKernel, StageColumns]


class KernelChain:
    """Stages run one after another on the same blocks, each reading what the input and the earlier stages
    gave.

    Attributes
    ----------
    steps : list of StageKernel or StageColumns
        The stages, in order.
    inputs : dict of str to frozenset of str
        The columns the chain reads from outside (those no earlier stage writes), in the order they are
        first read, each with the kinds of value (:data:`KINDS`) that every
        stage reading it from outside accepts (:data:`ANY_VALUE` where a stage
        declares none).
    nullable : dict of str to bool
        Whether an input column may be null: ``False`` where a stage reading it from outside fails on nulls.
    outputs : list of str
        Every column the stages write, in order.
    consumed : set of str
        The written columns that a later stage reads.
    types : dict of str to DataType
        The output columns' Spark types, where the stages give them.
    ragged : frozenset of str
        The columns some stage reads as sequences of varying length.
    missing : list of StageColumns
        The stages without a batch function.
    lengths : LengthRule or None
        The first stage's that batches by length a column the chain reads from outside (the column a
        request gives), if any.
    """

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self.inputs: dict[str, frozenset[str]] = {}
        self.nullable: dict[str, bool] = {}
        self.outputs: list[str] = []
        self.consumed: set[str] = set()
        for step in self.steps:
            for column in step.inputs:
                if column in self.outputs:
                    self.consumed.add(column)
                    continue
                kinds = frozenset(step.kinds.get(column) or ANY_VALUE)
                self.inputs[column] = self.inputs[column] & kinds if column in self.inputs else kinds
                self.nullable[column] = self.nullable.get(column, True) and step.nulls
            self.outputs += [c for c in step.outputs if c not in self.outputs]
        self.types: dict[str, Any] = {c: t for s in self.steps for c, t in s.types.items()}
        self.ragged = frozenset(c for s in self.steps for c in s.ragged)
        self.missing = [s for s in self.steps if not isinstance(s, StageKernel)]
        self.lengths = next((s.lengths for s in self.steps if isinstance(s, StageKernel) and s.lengths is not None
                             and s.lengths.column in self.inputs), None)

    @property
    def last_outputs(self) -> list[str]:
        """The last stage's output columns (none for an empty chain)."""
        return list(self.steps[-1].outputs) if self.steps else []

    def kernels(self) -> list[StageKernel]:
        """The stages' kernels; :class:`~irbis.errors.NoKernelError` naming every stage that has none."""
        if self.missing:
            names = ", ".join(f"{s.name} ({s.uid})" if s.uid else s.name for s in self.missing)
            raise NoKernelError([s.name for s in self.missing], f"these stages have no kernel: {names}")
        return list(self.steps)  # type: ignore[arg-type]

    def run(self, blocks: dict[str, Any]) -> dict[str, Any]:
        """Run the kernels on ``blocks`` (:func:`~irbis.kernels.blocks.run_steps`); every block, inputs
        included."""
        return ChainKernel.of(self).run(blocks)


@dataclass(frozen=True)
class ChainKernel:
    """A chain's kernels as one kernel value, which a runner ships like any other: each step's input
    columns and batch function, in order, and the blocks it gives (``outputs``; every block, inputs
    included, where empty). :attr:`files` are the steps' files, which :meth:`relocated` rewrites in each.

    Examples
    --------
    >>> double = StageKernel(["x"], ["y"], lambda b: {"y": b["x"] * 2})
    >>> ChainKernel.of(KernelChain([double]), ["y"])({"x": np.arange(3)})
    {'y': array([0, 2, 4])}
    """

    steps: tuple[tuple[tuple[str, ...], BatchFn], ...]
    outputs: tuple[str, ...] = ()

    @classmethod
    def of(cls, chain: KernelChain, outputs: Sequence[str] = ()) -> ChainKernel:
        """The kernels of ``chain`` (:class:`~irbis.errors.NoKernelError` where a stage has none)."""
        return cls(tuple((tuple(k.inputs), k.fn) for k in chain.kernels()), tuple(outputs))

    @property
    def files(self) -> tuple[str, ...]:
        """The local files the steps read (each once)."""
        return tuple(dict.fromkeys(f for _, fn in self.steps for f in getattr(fn, "files", ())))

    def relocated(self, paths: dict[str, str]) -> ChainKernel:
        """This chain with each step that reads files reading them at ``paths``."""
        def moved(fn: Any) -> Any:
            return fn.relocated(paths) if getattr(fn, "files", ()) else fn

        return replace(self, steps=tuple((columns, moved(fn)) for columns, fn in self.steps))

    def run(self, blocks: dict[str, Any]) -> dict[str, Any]:
        """Every block after the steps ran on ``blocks``, inputs included."""
        return run_steps(self.steps, blocks)

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        out = self.run(blocks)
        return {c: out[c] for c in self.outputs} if self.outputs else out
