"""Automatic minibatch sizing for the synchronous strategies (``batchSize="auto"``).

After Seide et al., "On parallelizability of stochastic gradient descent for speech DNNs" (ICASSP 2014),
and CNTK's AutoAdjust (``shared/papers/cntk-slides-parallel-training.txt``, "Automatic MB sizing"): at a
given learning rate there is a largest minibatch that still converges, so at the start of training, and
again every ``every`` epochs, the workers try candidate sizes on a small held sample of their rows from
the current weights and keep the largest one that still learns about as much as the smallest.

One search (``irbis.train.loop._search_batch``), on every worker at once:

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

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from irbis.train.optim import set_lr

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


def activation_bytes_per_row(model: torch.nn.Module, xb: torch.Tensor) -> float:
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
        with torch.no_grad():
            model(xb)
    finally:
        for h in handles:
            h.remove()
    return total / max(len(xb), 1)


def max_rows_in_memory(model: torch.nn.Module, xb: torch.Tensor, device: str) -> int | None:
    """The largest batch whose step fits: :data:`MEMORY_SHARE` of the free memory over three times the
    activations per row (kept for backward, their gradients, and the working space); None: no bound known."""
    free = available_bytes(device)
    per_row = activation_bytes_per_row(model, xb)
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


def mean_loss(model: torch.nn.Module, loss_fn: Any, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The loss over the rows of ``batches``, in training mode (BatchNorm on each batch's statistics, as the
    trials trained) and without gradients."""
    total, rows = 0.0, 0
    with torch.no_grad():
        for xb, yb in batches:
            total += float(loss_fn(model(xb), yb)) * len(yb)
            rows += len(yb)
    return total / max(rows, 1)


def trial(model: torch.nn.Module, optimizer: torch.optim.Optimizer, flat: Any, comm: Any, loss_fn: Any,
          batches: Iterable[tuple[torch.Tensor, torch.Tensor]], rate: float) -> int:
    """Synchronous steps over ``batches`` on every worker (the same number on each): the gradient averaged
    over the workers (one all-reduce of the flat buffer, as ``sync`` steps), every parameter group at its
    initial rate times ``rate`` (:func:`irbis.train.optim.set_lr`); returns the rows this worker computed."""
    set_lr(optimizer, rate)
    rows = 0
    for xb, yb in batches:
        flat.grads.zero_()
        loss_fn(model(xb), yb).backward()
        flat.sync_grads_in()
        comm.all_reduce_mean(flat.grads)
        optimizer.step()
        rows += len(yb)
    return rows


def seeded_rows(n: int, count: int, seed: int, rank: int, epoch: int) -> np.ndarray:
    """``count`` of ``n`` row ids, drawn from ``(seed, rank, epoch)`` apart from the training order's draws."""
    rng = np.random.default_rng([seed, rank, epoch, 0xA07B])
    return np.sort(rng.choice(n, size=min(count, n), replace=False))
