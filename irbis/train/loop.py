"""The one training loop every backend runs on every worker.

``train_worker(spec, shard, ctx)`` is a module-level function over plain
values, so it pickles cleanly into Spark tasks and subprocesses alike. It owns
data, forward, backward, metrics and checkpoints; what is communicated, and
when, belongs to the strategy.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from irbis.kernels.feed import feed_processes
from irbis.kernels.sequences import PadStats, input_kind
from irbis.kernels.threads import default_threads
from irbis.train import checkpoint as ckpt
from irbis.train.auto_batch import AutoBatch, search_batch
from irbis.train.batchnorm import average_buffers, recompute_batchnorm
from irbis.train.evaluate import AUC_BINS, auc_from_histograms, evaluate
from irbis.train.health import LossWatch, growth_warning, non_finite_error
from irbis.train.networks import build_network
from irbis.train.optim import (
    LossFn,
    WeightedCrossEntropy,
    batch_scale,
    class_weights,
    loss_entry,
    loss_label_dtype,
    make_loss,
    make_optimizer,
    param_groups,
    rate_factor,
    set_lr,
    update_batch,
)
from irbis.train.ragged import RaggedRows, check_network, first_batch, forward, is_ragged, usable_rows
from irbis.train.rows import BatchPlan, Rows, TensorRows
from irbis.train.strategies import make_strategy
from irbis.train.strategy import DistributedOptimizer, FlatParams, WorkerContext, embedding_tables
from irbis.train.worker_data import Augment, Shard, drop_nonfinite, split_validation

Report = Callable[[dict[str, Any]], None]

# Seeding torch's global RNG and drawing the initial weights is one step: ranks running as threads of
# one process would otherwise interleave their draws and start from timing-dependent weights.
_INIT_LOCK = threading.Lock()
# Rank 0 reports this many partial records per epoch (its running loss), so the bar moves within an epoch.
PROGRESS_UPDATES = 20
#: The arithmetic of a training step's forward and backward passes (``trainingPrecision``): see
#: :func:`step_autocast`.
TRAINING_PRECISIONS = ("auto", "fp32", "bf16")


# The groups of a TrainSpec. A field named in camel case is the estimator's Param of that name (its value
# parsed, where the Param is text); the others are what the estimator works out.


@dataclass(frozen=True)
class OptimSpec:
    """How a step updates the weights (``optimizer`` and ``loss`` resolved to what they name)."""

    optimizer: str | Callable[..., torch.optim.Optimizer] = "adam"
    learningRate: float = 1e-3
    momentum: float = 0.9
    unitGain: bool = False
    loss: str | LossFn = "cross_entropy"
    classWeights: str | list[float] | None = None  # cross-entropy weights: "balanced" or one per class
    lr_factors: dict[str, float] = field(default_factory=dict)  # parameter-name prefix -> learning-rate factor


@dataclass(frozen=True)
class ScheduleSpec:
    """How long, in batches of what size, at what rate over time."""

    epochs: int = 10
    batchSize: int = 32  # under batchSize="auto": the first size tried
    learningRateSchedule: dict[str, Any] | None = None
    lrScaling: str = "none"  # irbis.train.optim.LR_SCALINGS: the rate times the batch scaling
    warmupEpochs: float = 0.0  # epochs over which the batch scaling climbs from 1, step by step
    referenceBatchSize: int = 0  # the batch learningRate is meant for (0: batchSize, one worker's)
    earlyStoppingPatience: int = 0  # epochs without a better validation loss before stopping (0: never)
    recomputeBatchNorm: str = "auto"  # irbis.train.batchnorm.BATCHNORM_RECOMPUTE, see recompute_batchnorm
    auto_batch: AutoBatch | None = None  # batchSize="auto": how the size is searched


@dataclass(frozen=True)
class DataSpec:
    """How a worker reads, holds, splits and batches its rows."""

    seed: int = 0
    validationFraction: float = 0.0
    inputShape: list[int] | None = None
    shuffleBuffer: int = 10_000  # rows a worker holds in memory: its whole share below it, a shuffle window above
    feedProcesses: str = "auto"  # image rows decoded in worker processes (irbis.kernels.feed.feed_processes)
    tokenBudget: int = 4096  # variable-length rows: padded tokens (rows x padded length) per batch at most
    nanPolicy: str = "error"  # one of irbis.train.health.NAN_POLICIES
    input_format: Any = None  # irbis.train.stream.InputFormat of the features column (None: numbers)
    augment: Augment | None = None  # f(batch, rng), run on every batch
    prefetch: bool = False  # rows in memory: make the next batch on a thread
    spill_dir: str | None = None  # worker-local folder of the spill file (None: the temporary folder)
    classes_param: str | None = None  # the user's Param that set the network's classes, for the label error


@dataclass(frozen=True)
class CheckpointSpec:
    """Where (the run's own folder) and how often (steps; 0: every epoch) the workers write checkpoints."""

    checkpointDir: str | None = None
    checkpointInterval: int = 0


@dataclass(frozen=True)
class StrategySpec:
    """What the workers communicate, and when."""

    strategy: str = "sync"
    strategyOptions: dict[str, Any] = field(default_factory=dict)
    ps_endpoint: dict[str, Any] | None = None  # the driver's shards (irbis.train.ps.driver), if placed there


@dataclass(frozen=True)
class DeviceSpec:
    """Where and in what arithmetic a step runs."""

    device: str = "cpu"
    trainingPrecision: str = "auto"  # one of TRAINING_PRECISIONS (see step_autocast)
    torch_threads: int | None = None


#: The groups of a :class:`TrainSpec`, by field name.
GROUPS = {"optim": OptimSpec, "schedule": ScheduleSpec, "data": DataSpec, "checkpoint": CheckpointSpec,
          "parallel": StrategySpec, "hardware": DeviceSpec}


@dataclass(frozen=True)
class TrainSpec:
    """Everything a worker needs, as plain picklable values, in groups (:data:`GROUPS`): the optimizer
    (``optim``), the schedule, the data, the checkpoints, the strategy (``parallel``) and the device
    (``hardware``). Built by :meth:`of`, changed by :meth:`updated`, from values by name. ``step_hook``, for
    tests and benchmarks (:mod:`irbis.train.faults`): called with a worker's rank, a context manager the loop
    enters around each of its steps."""

    network: dict[str, Any]
    optim: OptimSpec = field(default_factory=OptimSpec)
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    data: DataSpec = field(default_factory=DataSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    parallel: StrategySpec = field(default_factory=StrategySpec)
    hardware: DeviceSpec = field(default_factory=DeviceSpec)
    step_hook: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None

    @staticmethod
    def names() -> dict[str, str]:
        """Every grouped value's name -> its group."""
        return {f.name: group for group, cls in GROUPS.items() for f in fields(cls)}

    @classmethod
    def of(cls, network: dict[str, Any], step_hook: Any = None, **values: Any) -> TrainSpec:
        """The spec of ``network`` with ``values`` by name, the defaults elsewhere."""
        return cls(network, step_hook=step_hook).updated(**values)

    def updated(self, **values: Any) -> TrainSpec:
        """This spec with ``values`` by name changed."""
        names, groups = self.names(), {}  # type: dict[str, str], dict[str, dict[str, Any]]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise TypeError(f"TrainSpec: unknown values {unknown}")
        for name, value in values.items():
            groups.setdefault(names[name], {})[name] = value
        return replace(self, **{g: replace(getattr(self, g), **changed) for g, changed in groups.items()})


@dataclass
class WorkerResult:
    """What a worker hands back: rank 0 carries the final weights. ``info["steps"]`` counts the worker's steps
    (unequal where the strategy lets workers run free, see :meth:`~irbis.train.strategy.Strategy.job_steps`),
    ``info["computedSteps"]`` those it computed a gradient for (see
    :meth:`~irbis.train.strategy.Strategy.step_decided`)."""

    rank: int
    history: list[dict[str, Any]]
    state: bytes | None = None
    loop_seconds: float = 0.0
    resumed_from: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Run:
    spec: TrainSpec
    ctx: WorkerContext
    model: torch.nn.Module
    dopt: DistributedOptimizer
    loss_fn: LossFn
    train: Rows
    val: Rows
    steps_per_epoch: int
    history: list[dict[str, Any]] = field(default_factory=list)
    report: Report | None = None
    skipped: int = 0
    watch: LossWatch | None = None
    computed: int = 0  # steps this worker computed a gradient for (see Strategy.step_decided)
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None  # early stopping: loss, epoch, weights
    rows: int = 0  # the most training rows a worker has (fixed-size batches: steps_per_epoch is this over the size)
    search: dict[str, Any] | None = None  # the epoch's batch-size search (batchSize="auto"), for its record
    pace: contextlib.AbstractContextManager[Any] = field(default_factory=contextlib.nullcontext)  # see step_hook


def worker_rows(shard: Any, spec: Any, rank: int, model: torch.nn.Module) -> tuple[Rows, Rows, int]:
    """A worker's training and validation rows, and the rows left out under ``nan_policy="skip"``.

    ``shard``: a :class:`~irbis.train.worker_data.Shard` (dense, or of variable-length rows) or a
    :class:`~irbis.train.stream.SpilledShard`; ``spec``: the run's :class:`~irbis.train.loop.TrainSpec`;
    ``model``: the network, whose ``input_kind`` variable-length batches take (checked on a first batch).
    The validation rows are a seeded share of the worker's (``validationFraction``)."""
    label_dtype = loss_label_dtype(spec.optim.loss)
    split_seed = spec.data.seed + 7919 * rank
    dense = isinstance(shard, Shard)
    ragged = is_ragged(shard.x) if dense else (spec.data.input_format is not None and spec.data.input_format.sequences)
    if ragged and spec.schedule.auto_batch is not None:
        raise ValueError("batchSize='auto' does not apply to variable-length rows: their batches are cut "
                         "by tokenBudget; give batchSize as a number (the most rows of a batch)")
    train: Any
    val: Any
    if dense and ragged:  # variable-length rows (irbis.train.ragged)
        keep, skipped = usable_rows(shard.x, shard.y, spec.data.nanPolicy)
        tr, va = split_validation(Shard(shard.x[keep], shard.y[keep]), spec.data.validationFraction, split_seed)
        train, val = (RaggedRows(s.x, np.asarray(s.y, label_dtype), input_kind(model), spec.data.tokenBudget,
                                 spec.schedule.batchSize) for s in (tr, va))
    elif dense:
        shard, skipped = drop_nonfinite(shard) if spec.data.nanPolicy == "skip" else (shard, 0)
        tr, va = split_validation(shard, spec.data.validationFraction, split_seed)
        train, val = (TensorRows.of(s, spec.data.inputShape, label_dtype, spec.hardware.device) for s in (tr, va))
    else:  # a SpilledShard (irbis.train.stream): rows read back a batch at a time
        train, val, skipped = shard.split(spec.data.validationFraction, split_seed, spec.data.nanPolicy)
        if ragged:  # token ids past the buffer: length batches within each shuffle window
            for rows in (train, val):
                rows.use_lengths(input_kind(model), spec.data.tokenBudget, spec.schedule.batchSize)
    first = first_batch(train, spec.hardware.device, label_dtype) if ragged else None
    if first is not None:
        check_network(model, first[0], train.kind, first[1])
    return train, val, skipped


def _setup(spec: TrainSpec, shard: Any, ctx: WorkerContext,
           model: torch.nn.Module | None) -> tuple[_Run, dict[str, Any] | None]:
    optim, device = spec.optim, spec.hardware.device
    if spec.hardware.torch_threads:
        torch.set_num_threads(spec.hardware.torch_threads)
    with _INIT_LOCK:
        torch.manual_seed(spec.data.seed)
        model = model if model is not None else build_network(spec.network)
    model = model.to(device).train()
    if channels_last(spec):
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs lack it
    flat = FlatParams(list(model.parameters()), embedding_tables(model))
    opt = make_optimizer(optim.optimizer, param_groups(model, optim.lr_factors, optim.learningRate), optim.learningRate,
                         optim.momentum, optim.unitGain)
    strategy = make_strategy(spec.parallel.strategy, **spec.parallel.strategyOptions)
    train, val, skipped = worker_rows(shard, spec, ctx.rank, model)
    steps = train.step_count(spec.schedule.batchSize, spec.data.seed, ctx.rank, spec.schedule.epochs)
    counts = [c.tolist() for c in ctx.comm.all_gather(torch.tensor([len(train), skipped, steps], dtype=torch.int64))]
    # every worker takes the steps of the one with the most batches (the others repeat some rows)
    steps = max(c[2] for c in counts)
    if min(c[0] for c in counts) == 0:
        raise ValueError(f"a worker has no training rows (rows per worker: {[c[0] for c in counts]}); "
                         "use fewer workers or more data")
    manifest = ckpt.latest(spec.checkpoint.checkpointDir)
    resume = None
    if manifest is not None:
        if manifest["worldSize"] != ctx.world_size:
            raise ValueError(f"checkpoint in {spec.checkpoint.checkpointDir} was written by {manifest['worldSize']} "
                             f"workers, this job has {ctx.world_size}; use a new checkpointDir")
        folder = spec.checkpoint.checkpointDir
        assert folder is not None  # a manifest was found in it
        resume = ckpt.load_worker(folder, manifest["step"], ctx.rank, device)
        flat.weights.copy_(resume["weights"])
    dopt = DistributedOptimizer(opt, strategy, ctx, flat, broadcast=resume is None)
    if resume is not None:
        dopt.load_state_dict(resume["optimizer"])
    loss_fn = make_loss(optim.loss)
    if optim.classWeights is not None and optim.loss == "cross_entropy":
        loss_fn = WeightedCrossEntropy(class_weights(optim.classWeights, train.labels(), ctx.comm).to(device))
    run = _Run(spec, ctx, model, dopt, loss_fn, train, val, steps, list(manifest["history"]) if manifest else [],
               skipped=sum(c[1] for c in counts), rows=max(c[0] for c in counts))
    if spec.step_hook is not None:
        run.pace = spec.step_hook(ctx.rank)
    if resume is not None and "batchSize" in resume:  # the size the search had chosen when the cut was made
        _use_batch(run, int(resume["batchSize"]))
    return run, resume


def channels_last(spec: TrainSpec) -> bool:
    """Whether the network and its batches are laid out channels-last: for images, on every device (oneDNN's
    and cuDNN's faster layout for convolutions, as fine-tuning EfficientNet-Lite0 by plain PyTorch shows:
    ``benchmarks/train_images.py``)."""
    return spec.data.input_format is not None and spec.data.input_format.images


def gpu_images(spec: TrainSpec) -> bool:
    """Whether the step runs the GPU's image path: channels-last batches (decoding and augmentation stay on
    the CPU threads, batches move through pinned memory), in bf16 under ``trainingPrecision='auto'``."""
    return spec.hardware.device.startswith("cuda") and channels_last(spec)


def step_autocast(spec: TrainSpec) -> contextlib.AbstractContextManager[Any]:
    """The forward passes' arithmetic while training: ``torch.autocast`` in bf16 on the training device for
    ``trainingPrecision='bf16'``, and for ``'auto'`` on the GPU's image path (:func:`gpu_images`); else
    none (fp32). Under autocast the matrix products and convolutions run in bf16 while the weights, their
    gradients, the optimiser's state and what the workers exchange stay fp32 (mixed precision; fast on a GPU,
    or a CPU with AMX or AVX-512 bf16 instructions: ``benchmarks/train_text.py`` measures it)."""
    if spec.hardware.trainingPrecision == "bf16" or (spec.hardware.trainingPrecision == "auto" and gpu_images(spec)):
        return torch.autocast("cuda" if spec.hardware.device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def bf16_emulated(device: str) -> bool:
    """Whether bf16 on ``device`` lacks instructions of its own (a CPU without AVX-512 bf16, which every CPU
    with AMX has): there autocast emulates bf16, slower than fp32. False where torch cannot tell."""
    if device.startswith("cuda"):
        return False
    has_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return has_bf16 is not None and not has_bf16()


@contextlib.contextmanager
def _step_precision(spec: TrainSpec, xb: torch.Tensor) -> Iterator[torch.Tensor]:
    """The forward pass's setting: image batches in channels-last (:func:`channels_last`), under
    :func:`step_autocast`."""
    if channels_last(spec) and xb.dim() == 4:
        xb = xb.contiguous(memory_format=torch.channels_last)
    with step_autocast(spec):
        yield xb


def _checkpoint(run: _Run, epoch: int, step_in_epoch: int, sums: torch.Tensor) -> None:
    spec, ctx = run.spec, run.ctx
    ctx.comm.barrier()  # a consistent cut: every worker's pushes to the parameter server are done
    payload = {"weights": run.dopt.flat.weights, "optimizer": run.dopt.state_dict(),
               "epoch": epoch, "stepInEpoch": step_in_epoch, "sums": sums, "batchSize": spec.schedule.batchSize}
    folder = spec.checkpoint.checkpointDir
    assert folder is not None  # cuts are made only into a checkpointDir
    ckpt.save_worker(folder, run.dopt.steps, ctx.rank, payload)
    ctx.comm.barrier()
    if ctx.rank == 0:
        ckpt.commit(folder, run.dopt.steps, {"worldSize": ctx.world_size, "history": run.history})


def _label_dtype(spec: TrainSpec) -> Any:
    return loss_label_dtype(spec.optim.loss)


def _plan(run: _Run, epoch: int, **more: Any) -> BatchPlan:
    """The worker's batches of ``epoch`` at the size in use (``more``: the other fields of the plan)."""
    spec = run.spec
    return BatchPlan(spec.schedule.batchSize, run.steps_per_epoch, spec.data.seed, run.ctx.rank, epoch,
                     spec.hardware.device, _label_dtype(spec),
                     feed_processes=feed_processes(spec.data.feedProcesses, spec.hardware.device, default_threads()),
                     **more)


def _run_epoch(run: _Run, epoch: int, start: int, sums: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Train one epoch from batch ``start``; ``sums`` = [loss·n, n] so far; also rows done now."""
    spec, ctx, dopt = run.spec, run.ctx, run.dopt
    # mid-epoch cuts need every worker at one step
    cuts = bool(spec.checkpoint.checkpointDir and spec.checkpoint.checkpointInterval)
    free = not cuts and dopt.strategy.job_steps() is not None
    # where the workers run free, the job's steps for the epoch are shared out by speed (see
    # Strategy.job_steps): a fast worker goes on into further rounds of its rows
    target = (epoch + 1) * run.steps_per_epoch * ctx.world_size if free else 0
    every = max(1, run.steps_per_epoch // PROGRESS_UPDATES)
    loss_sum, done = torch.zeros((), device=spec.hardware.device), 0
    run.watch = LossWatch(spec.hardware.device)
    if run.train.stats is not None:  # variable-length rows: this epoch's padding
        run.train.stats = PadStats()
    if free and (dopt.strategy.job_steps() or 0) >= target:
        # the job made this epoch's steps without this worker: it was retried after it died, and replays
        # the epochs its peers finished (their records come back from the store) without taking steps
        return sums, 0
    stream = run.train.train_batches(_plan(run, epoch, start=start, rounds=ctx.world_size if free else 1,
                                           augment=spec.data.augment, prefetch=spec.data.prefetch))
    try:
        for i, (xb, yb) in enumerate(stream, start + 1):
            if spec.schedule.warmupEpochs > epoch:  # the rate climbs step by step while warming up
                set_lr(dopt.optimizer, _rate(run, epoch, _progress(run, epoch, i, free)))
            dopt.zero_grad()
            computed = not dopt.step_decided()  # else faster workers made this step: take it as it is
            if computed:
                with _step_precision(spec, xb) as xb:
                    loss = run.loss_fn(forward(run.model, xb), yb)
                loss.backward()
            with run.pace:
                dopt.step()
            if computed:
                run.watch.see(i, loss.detach())
                loss_sum.add_(loss.detach(), alpha=len(yb))  # in place: no tensor allocated per step
                done += len(yb)
                run.computed += 1
            if cuts and dopt.steps % spec.checkpoint.checkpointInterval == 0:
                _checkpoint(run, epoch, i, sums + torch.tensor([float(loss_sum), done], dtype=torch.float64))
            if run.report is not None and i % every == 0 and i < run.steps_per_epoch:
                run.report({"epoch": epoch + 1, "step": i, "stepsPerEpoch": run.steps_per_epoch,
                            "loss": float(loss_sum) / max(done, 1)})
            if free and (dopt.strategy.job_steps() or 0) >= target:
                break
    finally:
        stream.close()
    sums[0] += loss_sum.cpu()
    sums[1] += done
    return sums, done


def _epoch_record(run: _Run, epoch: int, sums: torch.Tensor, done: int, seconds: float,
                  nbytes: int) -> dict[str, Any]:
    entry = loss_entry(run.spec.optim.loss)
    vloss, correct, nval, hist = evaluate(run.model, run.loss_fn, run.val, max(run.spec.schedule.batchSize, 64),
                                          run.spec.hardware.device, _label_dtype(run.spec),
                                          entry.correct if entry is not None else None)
    watched = run.watch.stats() if run.watch is not None else [0.0, 0.0, 0.0]
    stats = torch.cat([torch.tensor([float(sums[0]), float(sums[1]), vloss, correct, nval, done, seconds, nbytes,
                                     *watched], dtype=torch.float64), hist.reshape(-1)])
    run.ctx.comm.all_reduce_sum(stats)  # the record is made of collective results only: alike on every worker
    tl, tn, vl, vc, vn, dn, secs, sent, first, last, bad_ranks = stats[:11].tolist()
    if bad_ranks:
        assert run.watch is not None  # the epoch's watch saw the non-finite loss
        raise non_finite_error(run.ctx.comm, run.watch, run.train.nonfinite_rows(), epoch + 1, run.steps_per_epoch,
                               run.spec.optim.learningRate)
    rec = {"epoch": epoch + 1, "loss": tl / max(tn, 1), "samplesPerSecond": dn / max(secs / run.ctx.world_size, 1e-9),
           "bytesPerStep": sent / run.ctx.world_size / max(run.steps_per_epoch, 1)}
    rec["validationLoss"] = vl / vn if vn else None
    # accuracy where the labels say what is right: class indices, or a vector loss's own rule; None for mse
    counted = _label_dtype(run.spec) == np.int64 or (entry is not None and entry.correct is not None)
    rec["accuracy"] = vc / vn if vn and counted else None
    auc = auc_from_histograms(stats[11:].reshape(2, AUC_BINS))
    if auc is not None:
        rec["auc"] = auc
    rec.update(run.dopt.strategy.summary(run.ctx))
    rec["batchSize"] = run.spec.schedule.batchSize
    if run.search is not None:
        rec["batchTrials"] = run.search["losses"]
        rec["trialSamples"] = run.search["samples"]
        rec["searchSeconds"] = run.search["seconds"]
    if run.spec.data.nanPolicy == "skip":
        rec["skippedRows"] = run.skipped
    if run.train.stats is not None:  # padded tokens over real tokens, every worker's batches
        pads = torch.tensor([run.train.stats.padded, run.train.stats.tokens], dtype=torch.float64)
        run.ctx.comm.all_reduce_sum(pads)
        rec["paddingWaste"] = float(pads[0] / pads[1]) if pads[1] else None
    warnings = [growth_warning(first, last, epoch + 1, run.spec.optim.learningRate, run.ctx.world_size)]
    if not run.history and run.spec.hardware.trainingPrecision == "bf16" and bf16_emulated(run.spec.hardware.device):
        warnings.append("trainingPrecision='bf16' on a CPU without bf16 instructions (AVX-512 bf16 or AMX): "
                        "autocast emulates bf16 there and runs slower than fp32; set trainingPrecision='fp32'")
    if any(warnings):
        rec["warning"] = "; ".join(w for w in warnings if w)
    return rec


def _rate(run: _Run, epoch: int, progress: float, batch_size: int | None = None) -> float:
    """The factor on the base rate ``progress`` epochs into training (see :func:`irbis.train.optim.rate_factor`);
    ``lr_scaling`` scales it by the rows of one update (:func:`irbis.train.optim.update_batch`) of
    ``batch_size`` rows per worker (None: the size in use; the search's candidates) over
    ``reference_batch_size`` (0: one worker's batch; under ``batchSize="auto"`` the smallest candidate)."""
    spec = run.spec
    batch_size = batch_size or spec.schedule.batchSize
    rows = update_batch(run.dopt.strategy, batch_size, run.ctx.world_size)
    sched = spec.schedule
    reference = sched.referenceBatchSize or (sched.auto_batch.smallest if sched.auto_batch else batch_size)
    scale = batch_scale(sched.lrScaling, rows, reference)
    return rate_factor(epoch, progress, sched.learningRateSchedule, sched.epochs, scale, sched.warmupEpochs)


def _use_batch(run: _Run, batch_size: int) -> None:
    """Train on with ``batch_size`` rows per worker and step: the spec and the steps of an epoch follow."""
    if batch_size != run.spec.schedule.batchSize:
        run.spec = run.spec.updated(batchSize=batch_size)
        run.steps_per_epoch = -(-run.rows // batch_size)


def _progress(run: _Run, epoch: int, i: int, free: bool) -> float:
    """Epochs of training done before step ``i`` (from 1) of ``epoch``: the job's steps where the workers
    run free (a fast worker takes more steps than its share), else this worker's."""
    steps = run.steps_per_epoch
    job = run.dopt.strategy.job_steps() if free else None
    if job is not None:
        return min(max(job / (steps * run.ctx.world_size), float(epoch)), epoch + 1.0)
    return epoch + (i - 1) / steps


def _train(run: _Run, resume: dict[str, Any] | None) -> float:
    """The epochs, then the strategy's finalize; returns when the loop started (perf_counter)."""
    spec, ctx = run.spec, run.ctx
    start_epoch, start_step = 0, 0
    if resume is not None:
        start_epoch, start_step = int(resume["epoch"]), int(resume["stepInEpoch"])
    t_loop = time.perf_counter()
    for epoch in range(start_epoch, spec.schedule.epochs):
        first = resume is not None and epoch == start_epoch
        t0, b0 = time.perf_counter(), ctx.comm.bytes_sent
        run.search = None
        auto = run.spec.schedule.auto_batch
        if auto is not None and epoch % auto.every == 0 and not (first and start_step > 0):
            run.search = search_batch(run.model, run.dopt, ctx, run.loss_fn, run.train, auto, _plan(run, epoch),
                                      channels_last(spec), lambda b: _rate(run, epoch, epoch, b),
                                      autocast=lambda: step_autocast(spec))
            _use_batch(run, run.search["batchSize"])
        set_lr(run.dopt.optimizer, _rate(run, epoch, epoch))
        sums = resume["sums"].clone() if first and resume is not None else torch.zeros(2, dtype=torch.float64)
        sums, done = _run_epoch(run, epoch, start_step if first else 0, sums)
        nbytes, secs = ctx.comm.bytes_sent - b0, time.perf_counter() - t0
        run.history.append(_epoch_record(run, epoch, sums, done, secs, nbytes))
        if run.report is not None:
            run.report(run.history[-1])
        if spec.checkpoint.checkpointDir and not spec.checkpoint.checkpointInterval:
            _checkpoint(run, epoch + 1, 0, torch.zeros(2, dtype=torch.float64))
        if spec.schedule.earlyStoppingPatience and _stop_early(run, epoch):
            break
    run.dopt.finalize()
    if run.best is not None and run.best[1] != len(run.history):
        run.model.load_state_dict(run.best[2])
        run.history[-1]["restoredEpoch"] = run.best[1]
    return t_loop


def _stop_early(run: _Run, epoch: int) -> bool:
    """Keep the weights of the epoch with the lowest validation loss; True once ``early_stopping_patience``
    epochs passed without a lower one. The loss is a collective result, so every worker decides alike."""
    loss = run.history[-1]["validationLoss"]
    if loss is None:
        return False
    if run.best is None or loss < run.best[0]:
        run.best = (loss, epoch + 1, {k: v.detach().clone() for k, v in run.model.state_dict().items()})
        return False
    return epoch + 1 - run.best[1] >= run.spec.schedule.earlyStoppingPatience


def train_worker(spec: TrainSpec, shard: Any, ctx: WorkerContext, report: Report | None = None,
                 model: torch.nn.Module | None = None) -> WorkerResult:
    """Train on this worker's ``shard``; rank 0's result carries the final ``state_dict`` bytes.

    ``model`` is the network already built from ``spec.network`` (built here when None).
    """
    t_setup = time.perf_counter()
    run, resume = _setup(spec, shard, ctx, model)
    run.report = report if ctx.rank == 0 else None
    try:
        t_loop = _train(run, resume)
    finally:
        run.dopt.strategy.close()  # stops dedicated servers also when training stopped early
        run.dopt.flat.release()
    t_after = time.perf_counter()
    recompute_batchnorm(run.model, run.train, spec.schedule.recomputeBatchNorm, _plan(run, spec.schedule.epochs))
    average_buffers(run.model, ctx)
    loop_seconds = time.perf_counter() - t_loop
    state = None
    if ctx.rank == 0:
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu().clone() for k, v in run.model.state_dict().items()}, buf)
        state = buf.getvalue()
    return WorkerResult(ctx.rank, run.history, state, loop_seconds,
                        None if resume is None else int(resume["optimizer"]["steps"]),
                        {"steps": run.dopt.steps, "computedSteps": run.computed,
                         "setupSeconds": t_loop - t_setup, "afterEpochsSeconds": time.perf_counter() - t_after})
