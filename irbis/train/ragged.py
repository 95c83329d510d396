"""A worker's variable-length rows (token ids, or steps of float features) in length-bucketed batches.

A :class:`~irbis.train.worker_data.Shard` whose ``x`` is an object array of 1-d int64 arrays (or of 2-d float32
``(steps, features)`` arrays) holds ragged rows. :class:`RaggedRows` trains from them as
:class:`~irbis.train.stream.StreamRows` does from a spill, with the same methods the loop calls:

* **batches**: each epoch, a worker's rows are shuffled (seeded by (seed, rank, epoch)) and cut into chunks
  of :data:`GROUP_CHUNK` batches' rows; within a chunk, rows are sorted by length (rows of one length
  kept in the permutation's order) and cut under the token budget by
  :func:`irbis.kernels.sequences.length_batches` (``batch_size`` caps the rows). So a batch holds rows of
  alike length drawn afresh each epoch from a random chunk: not the same neighbours in length every epoch,
  and, where the data holds copies of the same texts, only the copies that fell in one chunk side by side
  (a sort of the whole shard would put all of them there). Grouping by padded length (rows of one
  multiple of 8 cost the same) spreads copies further, but a recurrent network learned worse from it.
  The ORDER of the batches is then drawn by a generator seeded by (seed, epoch), alike on every worker
  (:func:`matched_order`), so that at each step the workers take batches of about the same length rank,
  since a synchronous step waits for its slowest worker (streamed from a spill, window by window, each
  worker shuffles its own batches, seeded by (seed, rank, epoch));
* **equal steps**: every worker takes the same number of steps per epoch, the largest worker's count of
  batches (agreed through the communicator in the loop's setup). A worker with fewer batches repeats
  some (those the matched order gives twice). Every row is seen once per epoch, plus those repeats;
* **the network's input**: a batch reaches the network as its ``input_kind`` attribute declares
  (:func:`irbis.kernels.sequences.input_kind`): ``"padded"`` (the default) ``module(ids, mask)``, ids
  padded with 0 on the right to the batch's padded length, mask 1 on real positions; ``"packed"``
  ``module(packed)``, a :class:`torch.nn.utils.rnn.PackedSequence`. Rows of float vectors give float32
  ``(B, T, F)`` instead of ids.

The padded and real tokens of the batches made are counted (:class:`~irbis.kernels.sequences.PadStats`)
for the epoch record's ``paddingWaste``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from irbis.kernels.sequences import PadStats, length_batches, pad_rows, padded_length
from irbis.train.rows import BatchedRows, BatchPlan
from irbis.train.worker_data import finite_rows

#: The rows of a chunk that length batches are cut from, in batches of the row cap: rows of alike length
#: within a random chunk, each epoch's afresh (see the module docstring).
GROUP_CHUNK = 50

#: A batch as the network takes it: ``(ids, mask)`` (padded) or a PackedSequence (packed).
Batch = Any


def is_ragged(x: Any) -> bool:
    """Whether a shard's features are variable-length rows (an object array of arrays)."""
    return isinstance(x, np.ndarray) and x.dtype == object


def row_lengths(rows: np.ndarray) -> np.ndarray:
    """The length (steps) of each row; -1 for a null row."""
    return np.array([-1 if r is None else len(r) for r in rows], dtype=np.int64)


def forward(model: torch.nn.Module, xb: Batch) -> torch.Tensor:
    """``model`` on one batch: ``model(ids, mask)`` for a padded batch, ``model(xb)`` otherwise."""
    return model(*xb) if isinstance(xb, tuple) and not isinstance(xb, PackedSequence) else model(xb)


def matched_order(n: int, count: int, rng: np.random.Generator, rank: int = 0) -> np.ndarray:
    """Which of a worker's ``n`` batches, sorted by length (shortest first), each of ``count`` steps takes
    (``count >= n``, the steps every worker takes), given ``rng`` seeded alike on every worker: at each step
    every worker of a synchronous job takes a batch of about the same length rank, since a step waits for
    its slowest worker and unmatched a short batch waits for a long one at most steps.

    The steps take the length quantiles ``(s + 0.5) / count`` of the slots ``s`` of one permutation of the
    ``count`` slots drawn from ``rng``, alike everywhere: a uniformly random order of lengths over time, as a
    plain shuffle's. Each worker takes its batch at that quantile of its own ``n``: every batch once when
    ``n == count``, some twice when fewer. Worker ``rank`` takes the batch ``rank`` further up (modulo
    ``n``): of a length next to it, not the same rows where the shards hold copies of the same texts."""
    slots = rng.permutation(count)
    if n == 0:
        return np.zeros(0, np.int64)
    return (((slots + 0.5) * n / count).astype(np.int64) + rank) % n


def make_batch(rows: list[np.ndarray], kind: str, device: str = "cpu") -> tuple[Batch, PadStats]:
    """``rows`` as one network input of ``kind`` (see the module docstring), and its padding."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    length = padded_length(lengths)
    if rows and np.asarray(rows[0]).ndim == 2:  # steps of float features
        feats = np.asarray(rows[0]).shape[1]
        ids = np.zeros((len(rows), length, feats), np.float32)
        mask = np.zeros((len(rows), length), np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
            mask[i, :len(r)] = 1
    else:
        ids, mask = pad_rows(rows, length)
    stats = PadStats(int(lengths.sum()), len(rows) * length, 1)
    ids_t, mask_t = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
    if kind == "packed":
        return pack_padded_sequence(ids_t, torch.from_numpy(lengths), batch_first=True,
                                    enforce_sorted=False), stats
    return (ids_t, mask_t), stats


class RaggedRows(BatchedRows):
    """Variable-length rows held in memory, read as length-bucketed batches (see the module docstring).

    ``rows``: an object array of arrays; ``labels``: one per row; ``kind``: the network's
    :func:`irbis.kernels.sequences.input_kind`; ``token_budget`` bounds ``rows x padded length`` of a batch,
    ``max_rows`` its rows.
    """

    def __init__(self, rows: np.ndarray, labels: np.ndarray, kind: str, token_budget: int, max_rows: int) -> None:
        self.rows, self._labels, self.kind = rows, labels, kind
        self.token_budget, self.max_rows = token_budget, max_rows
        self.lengths = row_lengths(rows)
        self.stats = PadStats()

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self) -> np.ndarray:
        return self._labels

    def plan(self, seed: int, rank: int, epoch: int) -> list[np.ndarray]:
        """The row indices of each length batch of ``epoch`` on worker ``rank``, shortest first: the rows
        in a permutation seeded by (seed, rank, epoch), cut into chunks of :data:`GROUP_CHUNK` batches'
        rows, each chunk's rows grouped by length under the token budget; every row in one batch."""
        n = len(self.rows)
        perm = np.random.default_rng([seed, rank, epoch, 9]).permutation(n)
        chunk = GROUP_CHUNK * self.max_rows
        batches: list[np.ndarray] = []
        for start in range(0, n, chunk):
            part = perm[start:start + chunk]
            batches += [part[b] for b in length_batches(self.lengths[part], token_budget=self.token_budget,
                                                        max_rows=self.max_rows)]
        longest = np.array([padded_length(self.lengths[b]) for b in batches], np.int64)
        return [batches[j] for j in np.argsort(longest, kind="stable")]

    def order(self, count: int, seed: int, rank: int, epoch: int) -> list[np.ndarray]:
        """The row indices of ``count`` batches of ``epoch`` (the steps every worker takes): the epoch's
        :meth:`plan` in the :func:`matched_order` of a generator seeded by (seed, epoch), alike on every
        worker, so that the workers of a step take batches of alike lengths; every batch once, and some
        twice on a worker with fewer batches than ``count`` (the repeats that equalise the workers' steps)."""
        plan = self.plan(seed, rank, epoch)
        if not plan:
            return []
        rng = np.random.default_rng([seed, epoch, 8])
        return [plan[j] for j in matched_order(len(plan), max(count, len(plan)), rng, rank)][:count]

    def _tensors(self, ids: np.ndarray, rows: list[np.ndarray], device: str,
                 label_dtype: Any) -> tuple[Batch, torch.Tensor]:
        """Rows ``ids`` (given as ``rows``, augmented or not) as one batch, their padding counted."""
        xb, stats = make_batch(rows, self.kind, device)
        self.stats.add(stats)
        return xb, torch.from_numpy(np.ascontiguousarray(self._labels[ids], label_dtype)).to(device)

    def batches(self, plan: BatchPlan, augment: bool = True,
                hook: Callable[[np.ndarray, int], np.ndarray] | None = None) -> Iterator[tuple[Batch, torch.Tensor]]:
        """``(xb, yb)`` for batches ``start..steps * rounds - 1`` of the plan's epoch (see :meth:`order`; its
        ``batch_size`` is the row cap given at construction); ``hook(rows, i)`` (the estimator's ``augment``)
        gets batch ``i``'s rows before they are padded (see :func:`augment_rows`)."""
        order = self.order(plan.steps * plan.rounds, plan.seed, plan.rank, plan.epoch)
        for i, ids in enumerate(order[plan.start:], plan.start):
            rows = [self.rows[j] for j in ids]
            yield self._tensors(ids, rows if hook is None else augment_rows(hook, rows, i), plan.device,
                                plan.label_dtype)

    def step_count(self, batch_size: int, seed: int, rank: int, epochs: int) -> int:
        """The length batches of one pass, the most of any of the ``epochs`` (their chunks differ by epoch;
        ``batch_size`` is the row cap given at construction)."""
        return max((len(self.plan(seed, rank, e)) for e in range(epochs)), default=0)

    def sample(self, positions: np.ndarray, device: str,
               label_dtype: Any) -> Callable[[int, int, int], Iterator[tuple[Batch, torch.Tensor]]]:
        """The rows at ``positions``, ``size`` at a time by ``batches(lo, hi, size)`` (padding not counted)."""
        def batches(lo: int, hi: int, b: int) -> Iterator[tuple[Batch, torch.Tensor]]:
            for s in range(lo, hi, b):
                ids = positions[s:min(s + b, hi)]
                xb, _ = make_batch([self.rows[j] for j in ids], self.kind, device)
                yield xb, torch.from_numpy(np.ascontiguousarray(self._labels[ids], label_dtype)).to(device)
        return batches

    def nonfinite_rows(self) -> int:
        """0: rows that are not finite were named or left out (:func:`usable_rows`)."""
        return 0

    def in_order(self, batch_size: int, device: str, label_dtype: Any,
                 limit: int | None = None) -> Iterator[tuple[Batch, torch.Tensor]]:
        """Every row once (up to ``limit`` rows), in length batches, unshuffled (validation)."""
        rows = len(self) if limit is None else min(limit, len(self))
        lengths = self.lengths[:rows]
        for ids in length_batches(lengths, token_budget=self.token_budget, max_rows=self.max_rows):
            xb, _ = make_batch([self.rows[i] for i in ids], self.kind, device)
            yield xb, torch.from_numpy(np.ascontiguousarray(self._labels[ids], label_dtype)).to(device)


def augment_rows(hook: Callable[[np.ndarray, int], np.ndarray], rows: list[np.ndarray], i: int) -> list[np.ndarray]:
    """Batch ``i``'s variable-length rows through ``hook`` (the estimator's ``augment``): it gets them as an
    object array of 1-D int64 arrays, before padding, and returns as many rows of token ids (their lengths
    may change: token dropout, cropping). Anything else is refused, naming what came back."""
    given = np.empty(len(rows), dtype=object)
    given[:] = rows
    out = hook(given, i)
    if len(out) != len(rows):
        raise ValueError(f"augment returned {len(out)} rows for a batch of {len(rows)} variable-length rows; "
                         "it must return one row of token ids per row")
    back = []
    for k, row in enumerate(out):
        arr = np.asarray(row)
        if arr.ndim != 1 or len(arr) == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"augment returned row {k} as {arr.dtype} of shape {arr.shape}; variable-length rows "
                             "must stay non-empty 1-D arrays of integer token ids")
        back.append(arr.astype(np.int64, copy=False))
    return back


def check_network(model: torch.nn.Module, xb: Batch, kind: str, rows: int) -> torch.Tensor:
    """One forward pass on a first small batch ``xb`` of ``rows`` rows before the first step, its output
    returned: a network that does not take its declared input is named here, not at the first step
    (dropout's draws are left as they were)."""
    shown = "module(ids, mask), ids int64 (B, T)" if kind == "padded" else \
        "module(packed), a torch.nn.utils.rnn.PackedSequence"
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            out = forward(model, xb)
        except Exception as err:
            raise ValueError(f"the network does not take variable-length rows as its input_kind "
                             f"{kind!r} gives them ({shown}; set the module's input_kind attribute to "
                             f"'padded' or 'packed'): {type(err).__name__}: {err}") from err
    if not isinstance(out, torch.Tensor) or out.shape[0] != rows:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the network's output for a batch of {rows} variable-length rows (input_kind "
                         f"{kind!r}) must have one row per input row, found {got}")
    return out


def first_batch(rows: Any, device: str, label_dtype: Any) -> tuple[Batch, int] | None:
    """A small first batch of ``rows`` (a :class:`RaggedRows` or sequence ``StreamRows``) and its row count,
    for :func:`check_network`; None when there are no rows."""
    if not len(rows):
        return None
    xb, yb = next(iter(rows.in_order(2, device, label_dtype, limit=2)))
    return xb, len(yb)


def usable_rows(rows: np.ndarray, labels: np.ndarray, nan_policy: str) -> tuple[np.ndarray, int]:
    """The indices of the rows to train on, and how many were left out: a null or empty row, or a label
    that is not finite, is named (``nan_policy="error"``) or left out and counted (``"skip"``)."""
    lengths = row_lengths(rows)
    bad = (lengths <= 0) | ~finite_rows(labels)
    if bad.any() and nan_policy != "skip":
        i = int(np.flatnonzero(bad)[0])
        what = "a null" if lengths[i] < 0 else "an empty" if lengths[i] == 0 else "a non-finite label on a"
        raise ValueError(f"{what} sequence at row {i} of this worker's rows ({int(bad.sum())} such rows); "
                         "set nanPolicy='skip' to leave them out")
    return np.flatnonzero(~bad), int(bad.sum())


__all__ = ["RaggedRows", "check_network", "first_batch", "forward", "is_ragged",
           "make_batch", "row_lengths", "usable_rows"]
