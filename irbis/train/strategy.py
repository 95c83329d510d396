"""The strategy seam: what is communicated, and when.

A :class:`Strategy` is a small object, like a DDP communication hook: it sees
the model's parameters as ONE flat weight buffer and ONE flat gradient buffer
(the parameters and their ``.grad`` are views into them, so a whole model
travels in a single collective), and it owns nothing but communication and
its own state. :class:`DistributedOptimizer` wraps any ``torch.optim``
optimizer and drives the hooks around each step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from irbis.train.comm import Communicator


@dataclass
class WorkerContext:
    """Where a worker runs: its communicator, rank, world size, device, and the host it may bind to.

    ``servers`` is the communicator of the whole barrier stage (the workers, ranks ``0..N-1``, then the
    dedicated parameter servers) when the strategy has dedicated servers; None otherwise. ``comm`` always
    spans the workers only. ``endpoint`` is where the driver serves the shards (addresses and the job's
    secret, see :mod:`irbis.train.ps.driver`) when the strategy places them there; None otherwise.
    """

    comm: Communicator
    rank: int
    world_size: int
    device: str = "cpu"
    host: str = "127.0.0.1"
    servers: Communicator | None = None
    endpoint: dict[str, Any] | None = None


#: The fewest rows an embedding table needs for its gradient to travel as rows (:func:`embedding_tables`).
ROW_SPARSE_MIN_ROWS = 1024


def embedding_tables(model: torch.nn.Module, min_rows: int = ROW_SPARSE_MIN_ROWS) -> list[torch.nn.Embedding]:
    """The model's large embedding tables whose gradient is row-sparse: ``nn.Embedding`` modules of at least
    ``min_rows`` rows whose weight is trained, not tied to another module (an output layer sharing it gets a
    dense gradient) and not max-norm'd. A vocabulary's table is often most of a text network (half of
    MiniLM's 22.7 M weights), yet a batch of a few thousand tokens touches a few thousand of its rows."""
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    return [m for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and m.weight.requires_grad and m.num_embeddings >= min_rows
            and m.max_norm is None and uses[id(m.weight)] == 1]


class FlatParams:
    """The parameters of a model re-homed as views of one flat buffer.

    ``weights`` holds every parameter, ``grads`` every gradient; after
    construction ``p.data`` and ``p.grad`` are views into them, so a strategy
    communicates one contiguous tensor per collective.

    ``tables`` (see :func:`embedding_tables`) are embedding modules whose gradient autograd hands over as
    rows (``sparse=True`` while training, until :meth:`release`): :meth:`sync_grads_in` writes their rows
    into :attr:`grads` as for any parameter and records in :attr:`touched` which rows this worker's gradient
    has, so that a strategy may exchange those rows instead of the whole table (:func:`all_reduce_mean`).
    The optimizer still sees a dense gradient: the update is the same.
    """

    def __init__(self, params: list[torch.nn.Parameter], tables: Sequence[torch.nn.Embedding] = ()) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        total = sum(p.numel() for p in self.params)
        dev, dtype = self.params[0].device, self.params[0].dtype
        self.weights = torch.empty(total, device=dev, dtype=dtype)
        self.grads = torch.zeros(total, device=dev, dtype=dtype)
        self.offsets: list[tuple[int, int]] = []
        self._grad_views: list[torch.Tensor] = []
        off = 0
        for p in self.params:
            n = p.numel()
            weights = _slot(self.weights, p, off)
            weights.copy_(p.data)
            p.data = weights
            p.grad = _slot(self.grads, p, off)
            self._grad_views.append(p.grad)
            self.offsets.append((off, n))
            off += n
        index = {id(p): i for i, p in enumerate(self.params)}
        #: (parameter index, module) of each row-sparse table, in buffer order
        self.tables = sorted((index[id(m.weight)], m) for m in tables if id(m.weight) in index)
        self._sparse_before = [m.sparse for _, m in self.tables]
        for _, m in self.tables:
            m.sparse = True
        #: the (start, end) slices of :attr:`grads` outside the tables, in order
        self.dense_spans: list[tuple[int, int]] = []
        start = 0
        for i, _ in self.tables:
            off, n = self.offsets[i]
            if off > start:
                self.dense_spans.append((start, off))
            start = off + n
        if start < total:
            self.dense_spans.append((start, total))
        #: parameter index -> the rows of the table that hold this worker's gradient (set by sync_grads_in)
        self.touched: dict[int, torch.Tensor] = {}

    def zero_grads(self) -> None:
        """Zero :attr:`grads` in place (the views stay); the tables' gradients start anew as rows, and their
        views are written whole by :meth:`sync_grads_in`."""
        if not self.tables:
            self.grads.zero_()
            return
        for a, b in self.dense_spans:
            self.grads[a:b].zero_()
        for i, _ in self.tables:
            self.params[i].grad = None

    def sync_grads_in(self) -> None:
        """Make sure every ``p.grad`` lives in :attr:`grads` (copy if autograd replaced it)."""
        self.touched = {}
        tables = {i for i, _ in self.tables}
        for i, (p, view) in enumerate(zip(self.params, self._grad_views)):
            g = p.grad
            if g is None:
                view.zero_()
                p.grad = view
                if i in tables:
                    self.touched[i] = torch.zeros(0, dtype=torch.long, device=view.device)
            elif g.is_sparse:
                g = g.coalesce()
                rows = g.indices()[0]
                view.zero_()
                view.index_copy_(0, rows, g.values().to(view.dtype))
                p.grad = view
                self.touched[i] = rows
            elif g.data_ptr() != view.data_ptr():
                view.copy_(g)
                p.grad = view

    def release(self) -> None:
        """Give the tables back their own ``sparse`` setting (after training)."""
        for (_, m), before in zip(self.tables, self._sparse_before):
            m.sparse = before

    def shapes(self) -> list[torch.Size]:
        """The parameter shapes, in buffer order."""
        return [p.shape for p in self.params]


def all_reduce_mean(flat: FlatParams, comm: Communicator) -> None:
    """Replace ``flat.grads`` by its mean over the workers, exchanging of each row-sparse table only the rows
    that some worker's gradient has (:attr:`FlatParams.touched`): the other rows are zero on every worker,
    so their mean is zero too, and the result is the dense all-reduce's. One small collective first makes
    the union of the rows (and checks that every worker knows its rows); where the union is over half of the
    tables' rows, or a worker does not know its rows, the whole buffer goes in one collective as before."""
    if comm.world_size == 1 or not flat.tables:  # the same on every worker: no collective is skipped by one
        comm.all_reduce_mean(flat.grads)
        return
    tables = [i for i, _ in flat.tables]
    sizes = [flat.params[i].shape[0] for i in tables]
    marks = torch.zeros(sum(sizes) + 1, dtype=torch.int32, device=flat.grads.device)
    marks[-1] = int(all(i in flat.touched for i in tables))
    base = 0
    for i, n in zip(tables, sizes):
        if i in flat.touched:
            marks[base + flat.touched[i]] = 1
        base += n
    comm.all_reduce_sum(marks)
    union = marks[:-1] > 0
    if int(marks[-1]) < comm.world_size or 2 * int(union.sum()) > len(union):
        comm.all_reduce_mean(flat.grads)
        return
    rows: list[tuple[torch.Tensor, torch.Tensor]] = []
    base = 0
    for i, n in zip(tables, sizes):
        grad = flat.params[i].grad
        assert grad is not None  # the tables' gradients are views of the flat buffer
        rows.append((grad, union[base:base + n].nonzero().squeeze(1)))
        base += n
    for a, b in flat.dense_spans:  # in place: 1-D slices of one buffer are contiguous
        comm.all_reduce_mean(flat.grads[a:b])
    packed = torch.cat([g.index_select(0, r).reshape(-1) for g, r in rows])
    if packed.numel():  # the union is every worker's: all skip or none
        comm.all_reduce_mean(packed)
    at = 0
    for g, r in rows:
        n = r.numel() * g[0].numel()
        g.index_copy_(0, r, packed[at:at + n].view(r.numel(), *g.shape[1:]))
        at += n


def _slot(buffer: torch.Tensor, p: torch.Tensor, offset: int) -> torch.Tensor:
    """``p``'s place in a flat ``buffer`` from ``offset``: a view with ``p``'s own strides where ``p`` is dense
    (contiguous, or channels-last as image training lays convolution weights out), so that re-homing keeps
    the memory layout the step runs fastest in; otherwise a contiguous view."""
    n = p.numel()
    dense = p.is_contiguous() or (p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last))
    if dense:
        return buffer.as_strided(p.size(), p.stride(), buffer.storage_offset() + offset)
    return buffer[offset:offset + n].view_as(p)


class Strategy(ABC):
    """Base of all training strategies; subclasses live in ``irbis.train.strategies``.

    Hooks, in the order the loop calls them: :meth:`setup` once, then per step
    :meth:`reduce_grads` (before ``optimizer.step``) and :meth:`after_step`,
    then :meth:`finalize` once so that every replica ends with the same model.

    A strategy that owns the update (``owns_update = True``, the parameter-server
    family) implements :meth:`update` instead: it replaces the local optimizer
    step, and the local optimizer only supplies the learning rate.
    """

    name: ClassVar[str] = ""
    owns_update: ClassVar[bool] = False
    #: True where the final model is an average of replicas that trained apart (model averaging, BMUF): no
    #: replica's BatchNorm running statistics were gathered under those weights, so the loop recomputes them.
    averages_models: ClassVar[bool] = False

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """The constructor arguments as JSON values (what gets persisted)."""

    def check_workers(self, num_workers: int) -> None:
        """Raise ValueError if the options cannot run on ``num_workers`` workers (called before training)."""

    def server_tasks(self, num_workers: int) -> int:
        """Tasks the job needs beside its ``num_workers`` workers (dedicated parameter servers); 0 by default."""
        return 0

    def shard_options(self, ctx: WorkerContext | None) -> dict[str, Any]:
        """The options of the parameter server's shards (the strategies that have :meth:`server_tasks`)."""
        raise NotImplementedError(f"{type(self).__name__} has no parameter server")

    def elastic(self) -> bool:
        """True where workers do not run in lockstep and the model lives outside them (shards on the
        driver): the workers then run as ordinary tasks, one that dies is retried alone and rejoins
        (see :mod:`irbis.train.ps.driver`), and :meth:`setup` gives a worker its starting weights.
        False by default."""
        return False

    def setup(self, flat: FlatParams, ctx: WorkerContext) -> None:
        """Create the strategy's state; replicas already hold the same starting weights (unless
        :meth:`elastic`, where setup fetches them)."""

    def reduce_grads(self, flat: FlatParams, ctx: WorkerContext, step: int) -> None:
        """Turn the local gradient in ``flat.grads`` into the one to apply."""

    def after_step(self, flat: FlatParams, ctx: WorkerContext, step: int) -> None:
        """Run after ``optimizer.step()``; ``step`` counts from 1."""

    def step_decided(self, ctx: WorkerContext, step: int) -> bool:
        """True where faster workers already made step ``step``'s update without this worker, which would
        compute a gradient only to have it dropped: the loop then takes the step without computing one.
        False by default."""
        return False

    def update(self, flat: FlatParams, ctx: WorkerContext, step: int, lr: float) -> None:
        """Apply the gradient in ``flat.grads`` to ``flat.weights`` (only when :attr:`owns_update`)."""
        raise NotImplementedError(f"{type(self).__name__} does not own the update")

    def job_steps(self) -> int | None:
        """Steps all workers took together, as far as this worker knows; None (the default) where every
        worker must take the same steps (a collective per step).

        A strategy whose workers never wait for each other returns a count, and the loop then lets
        each worker take batches until the job's share of the epoch (steps per epoch times workers)
        is spent: a fast worker takes more steps, a straggler fewer, and nobody waits for the slowest
        worker's fixed share at the epoch's end.
        """
        return None

    def finalize(self, flat: FlatParams, ctx: WorkerContext) -> None:
        """Make the replicas agree at the end of training."""

    def close(self) -> None:
        """Release what :meth:`setup` acquired, also when training stopped early; a no-op by default."""

    def summary(self, ctx: WorkerContext) -> dict[str, Any]:
        """Collective, once per epoch on every worker: JSON metrics for the epoch's record."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values only (saved with ``torch.save``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({args})"


class DistributedOptimizer:
    """Any ``torch.optim`` optimizer, driven by a :class:`Strategy`.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        Built over ``model.parameters()`` *after* :class:`FlatParams` re-homed them
        (views keep their identity, so building before is fine too).
    strategy : Strategy
    ctx : WorkerContext
    flat : FlatParams
    broadcast : bool, default True
        Start every replica from rank 0's weights (False when resuming, where
        each worker restored its own weights from its checkpoint).

    Examples
    --------
    >>> dopt = DistributedOptimizer(opt, SyncSGD(), ctx, flat)   # doctest: +SKIP
    >>> loss.backward(); dopt.step()                             # doctest: +SKIP
    """

    def __init__(self, optimizer: torch.optim.Optimizer, strategy: Strategy, ctx: WorkerContext,
                 flat: FlatParams, broadcast: bool = True) -> None:
        self.optimizer = optimizer
        self.strategy = strategy
        self.ctx = ctx
        self.flat = flat
        self.steps = 0
        if broadcast and not strategy.elastic():
            ctx.comm.broadcast(flat.weights, src=0)
        strategy.setup(flat, ctx)

    def zero_grad(self) -> None:
        """Zero the flat gradient buffer in place (keeps the views; see :meth:`FlatParams.zero_grads`)."""
        self.flat.zero_grads()

    def step(self) -> None:
        """Reduce the gradients as the strategy says, step, then the strategy's after-step
        (or let a strategy that owns the update apply it)."""
        self.steps += 1
        self.flat.sync_grads_in()
        if self.strategy.owns_update:
            self.strategy.update(self.flat, self.ctx, self.steps, float(self.optimizer.param_groups[0]["lr"]))
        else:
            self.strategy.reduce_grads(self.flat, self.ctx, self.steps)
            self.optimizer.step()
            self.strategy.after_step(self.flat, self.ctx, self.steps)

    def step_decided(self) -> bool:
        """Whether the next step's update is already made without this worker (see :meth:`Strategy.step_decided`)."""
        return self.strategy.step_decided(self.ctx, self.steps + 1)

    def finalize(self) -> None:
        """Let the strategy make every replica hold the same final model."""
        self.strategy.finalize(self.flat, self.ctx)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "strategy": self.strategy.state_dict(),
                "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.strategy.load_state_dict(state["strategy"])
        self.steps = int(state["steps"])
