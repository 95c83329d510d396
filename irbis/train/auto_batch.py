"""Automatic minibatch sizing for the synchronous strategies (``batchSize="auto"``).

After Seide et al., "On parallelizability of stochastic gradient descent for speech DNNs" (ICASSP 2014),
and CNTK's AutoAdjust (``shared/papers/cntk-slides-parallel-training.txt``, "Automatic MB sizing"): at a
given learning rate there is a largest minibatch that still converges, so at the start of training, and
again every ``every`` epochs, the workers try candidate sizes on a small held sample of their rows from
the current weights and keep the largest one that still learns about as much as the smallest.

One search (:func:`search_batch`), on every worker at once:

1. A seeded sample of ``sample_rows`` of each worker's training rows, more on large data (up to 5% of
   them, as many as ``min_steps`` steps of the largest candidate need), to train on, and a quarter as
   many more to judge on: a size is judged by the loss on rows its trial did not train on, so a size that
   fits the sample but generalises worse loses.
2. The judged rows' loss under the current weights, ``L0``.
3. For the size in use, then each larger candidate (ascending): from the same weights and optimizer state,
   synchronous steps of ``b`` rows per worker over the sample (the gradient averaged over the workers, as
   ``sync`` steps it) at the rate ``lrScaling`` gives that update (:func:`irbis.train.optim.update_batch`),
   every size over the same rows; then the judged rows' loss ``L_b``. Each size starts from the same
   weights, BatchNorm statistics and optimizer state.
4. The losses are averaged over the workers (every worker decides alike). The size kept is the largest
   ``b``, scanning upward and stopping at the first that fails, with
   ``L0 - L_b >= (1 - tolerance) * (L0 - L_in_use)``: it makes at least ``1 - tolerance`` of the size in
   use's progress on the sample. A candidate that would take fewer than ``min_steps`` steps over the
   sample, or whose step would not fit the memory of the worker with the least
   (:func:`max_rows_in_memory`), is not tried.

Training goes on from the kept size's trial: its steps were synchronous steps on training rows at the rate
training would use, so only the other sizes' trials (and the judging passes) are spent on the search. Where
no candidate larger than the size in use can be tried (memory, or fewer than ``min_steps`` steps over the
sample), no trial runs.

The size only grows, as CNTK's does: early in training, when the weights move fast, large batches at a
proportionally larger rate lose to small ones; later they keep up, and the search moves to them. A search
costs a pass over the sample per size tried but the one kept, plus a forward pass over the judged rows per
size, so it pays on epochs much larger than the sample (``autoBatchEvery`` spaces searches out on small
data).

With ``lrScaling="none"`` a larger batch takes fewer steps at the same rate, so it rarely keeps up: the
search then mostly keeps the smallest size. It pays with ``"linear"`` (SGD, momentum: Seide et al. sum
the gradient, which is the linear rule) or ``"sqrt"`` (Adam, Adagrad, RMSProp).

The sample is drawn from ``(seed, rank, epoch)`` and the trials run in a forked torch RNG (their draws
leave training's as they were); their rows count toward the samples seen (``trialSamples`` in the epoch's
record). One seed reproduces the sizes and the weights.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from irbis.train.optim import set_lr
from irbis.train.rows import BatchPlan, Rows
from irbis.train.strategy import DistributedOptimizer, WorkerContext, all_reduce_mean

#: Candidate sizes per worker when the estimator's ``autoBatchSizes`` is not set.
DEFAULT_CANDIDATES = (16, 32, 64, 128, 256, 512)
#: At most this many bytes of a sample held in memory (rows already in a worker's memory); a spilled shard's
#: sample (images, data past the buffer) is read a batch at a time instead.
SAMPLE_BYTES = 64 * 1024 * 1024
#: On large data the sample grows to this share of a worker's rows (see :func:`sample_size`).
SAMPLE_SHARE = 0.05
#: Share of the memory available when a search starts that one step's activations may take.
MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class AutoBatch:
    """How ``batchSize="auto"`` searches: candidate sizes per worker (ascending), epochs between searches,
    the tolerance on progress (in (0, 1)), the sample's rows, and the fewest updates a candidate must make
    over the sample to be tried."""

    candidates: tuple[int, ...] = DEFAULT_CANDIDATES
    every: int = 1
    tolerance: float = 0.05
    sample_rows: int = 512
    min_steps: int = 8

    def __post_init__(self) -> None:
        if not self.candidates or any(int(c) < 1 for c in self.candidates):
            raise ValueError(f"autoBatchSizes must be sizes >= 1, found {list(self.candidates)}")
        if not 0.0 < self.tolerance < 1.0:
            raise ValueError(f"autoBatchTolerance must lie in (0, 1), found {self.tolerance}")
        object.__setattr__(self, "candidates", tuple(sorted({int(c) for c in self.candidates})))

    @property
    def smallest(self) -> int:
        return self.candidates[0]


def chosen(trial_losses: dict[int, float], start_loss: float, tolerance: float) -> int:
    """The largest size, scanning upward from the smallest and stopping at the first that fails, whose loss
    makes at least ``1 - tolerance`` of the smallest size's progress from ``start_loss``. A non-finite loss
    fails."""
    sizes = sorted(trial_losses)
    best = sizes[0]
    gain = start_loss - trial_losses[best]
    for b in sizes[1:]:
        loss = trial_losses[b]
        if not math.isfinite(loss):
            break
        if gain > 0:
            ok = start_loss - loss >= (1.0 - tolerance) * gain
        else:  # the smallest made no progress: a larger one must at least match it
            ok = loss <= trial_losses[sizes[0]]
        if not ok:
            break
        best = b
    return best


def available_bytes(device: str) -> int | None:
    """Memory free for a step on ``device``: the GPU's free memory, or the host's available memory (Linux's
    ``MemAvailable``); None where it cannot be read."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def activation_bytes_per_row(model: torch.nn.Module, xb: torch.Tensor,
                             autocast: Callable[[], Any] = contextlib.nullcontext) -> float:
    """Bytes of the tensors the network's modules output for one row (measured on ``xb``, without
    gradients): what a training step keeps for its backward pass, per row."""
    total = 0

    def hook(_module: Any, _inputs: Any, output: Any) -> None:
        nonlocal total
        for t in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad(), autocast():
            model(xb)
    finally:
        for h in handles:
            h.remove()
    return total / max(len(xb), 1)


def max_rows_in_memory(model: torch.nn.Module, xb: torch.Tensor, device: str,
                       autocast: Callable[[], Any] = contextlib.nullcontext) -> int | None:
    """The largest batch whose step fits: :data:`MEMORY_SHARE` of the free memory over three times the
    activations per row (kept for backward, their gradients, and the working space); None: no bound known."""
    free = available_bytes(device)
    per_row = activation_bytes_per_row(model, xb, autocast)
    if free is None or per_row <= 0:
        return None
    return max(1, int(MEMORY_SHARE * free / (3.0 * per_row)))


def sample_size(auto: AutoBatch, row_bytes: int, rows: int) -> int:
    """Rows of the held sample: ``auto.sample_rows``, or more on large data: up to :data:`SAMPLE_SHARE` of the
    worker's ``rows``, as many as ``min_steps`` steps of the largest candidate need (so that it can be
    tried); at most the rows, and, for a sample held in memory (``row_bytes`` > 0), :data:`SAMPLE_BYTES` of
    inputs (``row_bytes`` 0: the sample is read a batch at a time, as spilled rows and images are)."""
    wanted = max(auto.sample_rows, min(int(rows * SAMPLE_SHARE), auto.min_steps * auto.candidates[-1]))
    by_bytes = SAMPLE_BYTES // row_bytes if row_bytes > 0 else wanted
    return max(1, min(wanted, by_bytes, rows))


def mean_loss(model: torch.nn.Module, loss_fn: Any, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
              autocast: Callable[[], Any] = contextlib.nullcontext) -> float:
    """The loss over the rows of ``batches``, in training mode (BatchNorm on each batch's statistics, as the
    trials trained) and without gradients."""
    total, rows = 0.0, 0
    with torch.no_grad(), autocast():
        for xb, yb in batches:
            total += float(loss_fn(model(xb), yb)) * len(yb)
            rows += len(yb)
    return total / max(rows, 1)


def trial(model: torch.nn.Module, optimizer: torch.optim.Optimizer, flat: Any, comm: Any, loss_fn: Any,
          batches: Iterable[tuple[torch.Tensor, torch.Tensor]], rate: float,
          autocast: Callable[[], Any] = contextlib.nullcontext) -> int:
    """Synchronous steps over ``batches`` on every worker (the same number on each): the gradient averaged
    over the workers (one all-reduce of the flat buffer, as ``sync`` steps), every parameter group at its
    initial rate times ``rate`` (:func:`irbis.train.optim.set_lr`), each forward pass under ``autocast()``
    (the steps' arithmetic, :func:`irbis.train.loop.step_autocast`); returns the rows this worker computed."""
    set_lr(optimizer, rate)
    rows = 0
    for xb, yb in batches:
        flat.zero_grads()
        with autocast():
            loss = loss_fn(model(xb), yb)
        loss.backward()
        flat.sync_grads_in()
        all_reduce_mean(flat, comm)
        optimizer.step()
        rows += len(yb)
    return rows


def seeded_rows(n: int, count: int, seed: int, rank: int, epoch: int) -> np.ndarray:
    """``count`` of ``n`` row ids, drawn from ``(seed, rank, epoch)`` apart from the training order's draws."""
    rng = np.random.default_rng([seed, rank, epoch, 0xA07B])
    return np.sort(rng.choice(n, size=min(count, n), replace=False))


def snapshot(model: torch.nn.Module, dopt: DistributedOptimizer) -> tuple[torch.Tensor, dict[str, torch.Tensor],
                                                                         dict[str, Any]]:
    """The weights, buffers (BatchNorm statistics) and optimizer state, copied: what a trial starts from."""
    return (dopt.flat.weights.clone(), {k: v.clone() for k, v in model.named_buffers()},
            copy.deepcopy(dopt.optimizer.state_dict()))


def restore(model: torch.nn.Module, dopt: DistributedOptimizer,
            snap: tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]) -> None:
    """Go back to a :func:`snapshot`."""
    weights, buffers, state = snap
    dopt.flat.weights.copy_(weights)
    for k, v in model.named_buffers():
        v.copy_(buffers[k])
    dopt.optimizer.load_state_dict(copy.deepcopy(state))  # a copy: load_state_dict keeps what it is given


def search_batch(model: torch.nn.Module, dopt: DistributedOptimizer, ctx: WorkerContext, loss_fn: Any, rows: Rows,
                 auto: AutoBatch, plan: BatchPlan, channels_last: bool, rate: Callable[[int], float],
                 autocast: Callable[[], Any] = contextlib.nullcontext) -> dict[str, Any]:
    """``batchSize="auto"``: try the size in use (``plan.batch_size``; the sample is drawn from the plan's seed,
    rank and epoch, and made on its device with its label type) and the larger candidates on a held sample of
    the workers' training ``rows`` from the current weights, and keep the largest that learns about as much
    as the size in use (see the module docstring). ``channels_last``: image batches are laid out so for the
    steps, as training's are; ``rate(b)`` is the factor on the base rate of a step of ``b`` rows per worker;
    ``autocast()`` is the steps' arithmetic (:func:`irbis.train.loop.step_autocast`), for trials and losses alike.
    Returns ``{"batchSize", "losses": {size: loss after its trial, "start": loss before}, "samples",
    "seconds"}``, alike on every worker (the losses are averaged over them). Training goes on from the kept
    size's trial (its steps were synchronous steps on training rows); the other trials are undone. Where no
    larger candidate can be tried there is nothing to compare and no trial runs (``losses`` is empty)."""
    t0 = time.perf_counter()
    current, device = plan.batch_size, plan.device
    n = sample_size(auto, rows.row_bytes(), len(rows) * 4 // 5)
    sample = rows.sample(seeded_rows(len(rows), n + max(n // 4, 1), plan.seed, plan.rank, plan.epoch), device,
                         plan.label_dtype)
    total_rows = min(n + max(n // 4, 1), len(rows))

    def rows_of(lo: int, hi: int, b: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        return ((xb.contiguous(memory_format=torch.channels_last) if channels_last and xb.dim() == 4 else xb, yb)
                for xb, yb in sample(lo, hi, b))

    # the trials train on the first n rows and are judged on the rest;
    # every worker tries the same sizes: the smallest sample and the least memory among them decide
    memory = max_rows_in_memory(model, next(iter(rows_of(0, 2, 2)))[0], device, autocast)
    mine = torch.tensor([float(n), float("inf") if memory is None else float(memory)], dtype=torch.float64)
    least, room = torch.stack(ctx.comm.all_gather(mine)).min(0).values.tolist()
    tried = [current] + [b for b in auto.candidates if current < b <= room and least // b >= auto.min_steps]
    if len(tried) == 1:
        return {"batchSize": current, "losses": {}, "samples": 0, "seconds": mean_seconds(ctx, t0)}
    steps_rows = int(least) - int(least) % tried[-1]  # every size sees the same rows: whole steps of the largest
    flat, opt = dopt.flat, dopt.optimizer
    start_state, kept = snapshot(model, dopt), None
    chunk = auto.smallest
    samples = 0
    found: dict[int, float] = {}
    with torch.random.fork_rng(devices=[]):  # the trials' draws (dropout) leave training's as they were
        judged = lambda: rows_of(n, total_rows, chunk)  # noqa: E731 - the rows every loss is judged on
        start = torch.tensor([mean_loss(model, loss_fn, judged(), autocast)], dtype=torch.float64)
        ctx.comm.all_reduce_mean(start)  # every worker decides alike: on the losses averaged over them
        for b in tried:  # upward from the size in use, stopping at the first that does not keep up
            if b != current:
                restore(model, dopt, start_state)
            samples += trial(model, opt, flat, ctx.comm, loss_fn,
                             rows_of(0, min(max(steps_rows // b, 1) * b, n), b), rate(b), autocast)
            loss = torch.tensor([mean_loss(model, loss_fn, judged(), autocast)], dtype=torch.float64)
            samples += total_rows - n
            ctx.comm.all_reduce_mean(loss)
            found[b] = float(loss)
            if chosen(found, float(start), auto.tolerance) != b:
                break
            kept = snapshot(model, dopt) if b != tried[-1] else None  # the last size's state is the model's own
    size = chosen(found, float(start), auto.tolerance)
    if kept is not None:  # a later size failed: go on from the kept size's trial
        restore(model, dopt, kept)
    flat.grads.zero_()
    total = torch.tensor([float(samples)], dtype=torch.float64)
    ctx.comm.all_reduce_sum(total)
    return {"batchSize": size, "losses": {"start": float(start), **{str(b): v for b, v in found.items()}},
            "samples": int(total.item()), "seconds": mean_seconds(ctx, t0)}


def mean_seconds(ctx: WorkerContext, t0: float) -> float:
    """Seconds since ``t0``, averaged over the workers (alike in every worker's record)."""
    seconds = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    ctx.comm.all_reduce_mean(seconds)
    return float(seconds)
