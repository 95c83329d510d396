"""A worker's rows streamed from disk: training on data larger than a worker's memory, and on images.

A worker reads its partition's Arrow batches once (:func:`read_partition`). While they fit in
``buffer_rows`` rows of numbers they stay in memory and become the dense :class:`~irbis.train.worker_data.Shard`
of small jobs; past that, and always for images, they are spilled as they arrive to a worker-local Arrow
IPC file of fixed blocks (:class:`Spill`), and the worker trains from there (:class:`SpilledShard`):

* every epoch visits the blocks in a fresh seeded permutation, a window of blocks (about ``buffer_rows``
  rows) at a time, and shuffles the rows of each window: memory holds two windows, whatever the data;
* each batch is read back from the file and decoded on the prefetch thread
  (:class:`InputFormat`): numbers as they are, tensor bytes with their dtype and shape, Spark image
  structs and encoded image files through the model's one image geometry
  (:mod:`irbis.kernels.image.network_input`), with the augmentation of :mod:`irbis.kernels.image.augment`
  drawn from a generator seeded by the run's seed, the worker, the epoch and the row;
* the read pass profiles the rows for the checks (:mod:`irbis.train.checks`), and decodes each image
  once, so that a corrupt file is known (skipped and counted, or named) before the first step.

Reading the file back costs a disk read per epoch, served from the page cache while the file fits in it.
The other way to stream, asking Spark for the partition again every epoch, would need one Spark job per
epoch and a barrier stage each time; the spill keeps the one stage.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from irbis.kernels.threads import for_each_row
from irbis.train.rows import BatchedRows, BatchPlan
from irbis.train.worker_data import Shard, finite_rows

#: Column names of the training frame (see :func:`irbis.spark.training.training_frame`).
FEATURES, LABEL = "__features", "__label"
#: Input kinds a training frame's features column may have.
INPUT_KINDS = ("vector", "tensor", "image", "encoded", "sequence")
#: Rows per block of the spill file.
BLOCK_ROWS = 256
#: Image rows are held by bytes as well as by rows: a spill block holds at most about BLOCK_BYTES of them,
#: and a shuffle window (``buffer_rows``) at most about WINDOW_BYTES, so that decoded images (a 320x240
#: struct is 230 KiB) keep a worker's memory flat however many rows its share has.
BLOCK_BYTES = 16 * 2 ** 20
WINDOW_BYTES = 64 * 2 ** 20


@dataclass
class InputFormat:
    """How a features value becomes one network input row.

    ``kind``: ``"vector"`` (a list of numbers), ``"sequence"`` (a list of token ids whose length varies per
    row, see :mod:`irbis.train.ragged`), ``"tensor"`` (raw little-endian bytes of ``dtype``, reshaped
    to ``shape``), ``"image"`` (a Spark image struct) or ``"encoded"`` (the bytes of an image file).
    ``preprocessing`` is a :class:`~irbis.models.preprocess.Preprocessing` as a dict (None: images keep their
    size, RGB 0..255, CHW), ``augmentation`` the parsed list of :func:`~irbis.kernels.image.augment.parse_augmentation`.
    """

    kind: str = "vector"
    shape: list[int] | None = None
    dtype: str = "float32"
    preprocessing: dict[str, Any] | None = None
    augmentation: list[dict[str, Any]] = field(default_factory=list)
    max_pixels: int | None = 100_000_000

    @property
    def images(self) -> bool:
        return self.kind in ("image", "encoded")

    @property
    def sequences(self) -> bool:
        return self.kind == "sequence"

    def _spec(self) -> Any:
        from irbis.models.preprocess import Preprocessing

        return None if self.preprocessing is None else Preprocessing.from_dict(self.preprocessing)

    def decode(self, column: pa.Array, rngs: list[np.random.Generator] | None = None) -> np.ndarray:
        """The rows of ``column`` as one float32 array ``(n, *row shape)``; ``rngs`` (one per row) augments
        images. Raises ``ValueError`` naming the row for a value that cannot be read."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        n = len(column)
        if self.kind == "sequence":  # ragged: an object array of int64 rows (None for a null row)
            return sequence_rows(column)
        if self.kind == "vector":
            return column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(n, -1)
        from irbis.kernels.batching import network_batch
        from irbis.kernels.blocks import from_arrow
        from irbis.kernels.image.network_input import preprocess_images

        spec = self._spec()
        values = from_arrow(column, FEATURES)
        if spec is None:  # tensor bytes, or image structs as they are: what TorchModel's transform reads
            return network_batch(values, FEATURES, self.shape, input_dtype=self.dtype).values
        if rngs is None or not self.augmentation:  # what ImageFeaturizer's transform reads
            return preprocess_images(values, spec, encoded=self.kind == "encoded", max_pixels=self.max_pixels,
                                     raise_errors=True)[0]
        return self._augmented(values, spec, rngs)

    def _augmented(self, values: Any, spec: Any, rngs: list[np.random.Generator]) -> np.ndarray:
        from irbis.kernels.image.augment import augment_rgb
        from irbis.kernels.image.network_input import load_rgb

        batch = np.empty((len(values), *spec.input_shape), np.float32)

        def row(i: int) -> None:  # each row draws from its own generator: the same batch on any thread count
            try:
                batch[i] = augment_rgb(load_rgb(values[i], spec, self.kind == "encoded", self.max_pixels), spec,
                                       self.augmentation, rngs[i])
            except Exception as err:  # noqa: BLE001 - named with its row
                raise ValueError(f"row {i} of the batch: {str(err).strip() or type(err).__name__}") from err

        for_each_row(row, len(values))  # on the task's cores: decoding, not the step, bounds a GPU's rate
        return batch

    def check_row(self, value: Any) -> tuple[int, str | None]:
        """One row's feature length as the network will see it, and why it cannot be read (None: it can);
        images are decoded once here."""
        from irbis.kernels.image.network_input import load_rgb

        spec = self._spec()
        try:
            if spec is not None:
                load_rgb(value, spec, self.kind == "encoded", self.max_pixels, fast=True)
                return int(np.prod(spec.input_shape)), None
            return int(np.asarray(value).size), None  # an image struct's pixels, read as they are
        except Exception as err:  # noqa: BLE001 - reported, not raised
            return 0, str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__


class Spill:
    """An Arrow IPC file of fixed blocks of rows, written once and read back a block at a time.

    Blocks are read with plain file reads (not a memory map), so what a worker holds is the blocks it
    asked for, not every page it ever touched.
    """

    def __init__(self, schema: pa.Schema, folder: str | None = None, block_rows: int = BLOCK_ROWS) -> None:
        self.dir = tempfile.mkdtemp(prefix="irbis-spill-", dir=folder)
        self.path = os.path.join(self.dir, "rows.arrow")
        self.block_rows = block_rows
        self._sink = pa.OSFile(self.path, "wb")
        self._writer = pa.ipc.new_file(self._sink, schema)
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self.sizes: list[int] = []
        self._reader: Any = None

    def write(self, batch: pa.RecordBatch) -> None:
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        while self._pending_rows >= self.block_rows:
            self._flush(self.block_rows)

    def _flush(self, rows: int) -> None:
        table = pa.Table.from_batches(self._pending)
        head, rest = table.slice(0, rows), table.slice(rows)
        self._writer.write_batch(head.combine_chunks().to_batches()[0])
        self.sizes.append(head.num_rows)
        self._pending = rest.to_batches() if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def close_writing(self) -> None:
        if self._pending_rows:
            self._flush(self._pending_rows)
        self._writer.close()
        self._sink.close()

    def __len__(self) -> int:
        return sum(self.sizes)

    def block(self, i: int) -> pa.RecordBatch:
        if self._reader is None:
            self._reader = pa.ipc.open_file(pa.OSFile(self.path, "rb"))
        return self._reader.get_batch(i)

    def reader_copy(self) -> Spill:
        """The same file with a reader of its own (one per thread)."""
        other = object.__new__(Spill)
        other.__dict__.update(self.__dict__)
        other._reader = None
        return other

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def read_partition(batches: Iterator[pa.RecordBatch], fmt: InputFormat, buffer_rows: int,
                   spill_dir: str | None = None) -> tuple[Shard | SpilledShard | None, np.ndarray]:
    """Read a partition once: a dense :class:`Shard` while numbers fit in ``buffer_rows`` rows, else (and for
    images) a :class:`SpilledShard`; and the partition's profile for the checks (see
    :func:`irbis.train.checks.shard_profile`). The shard is None when rows are null or of unequal length
    (the checks then fail on every worker)."""
    from irbis.train.checks import shard_profile

    held: list[pa.RecordBatch] = []
    held_rows = 0
    spill: Spill | None = None
    lengths: list[Any] = []  # per row (images) or per batch (arrays of lengths)
    labels, bad, reasons = [], [], []
    null_features = 0
    x_bad: list[np.ndarray] = []
    offset = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        feats, y = batch.column(FEATURES), batch.column(LABEL)
        labels.append(label_rows(y))
        if fmt.images:  # a null image (a file read_images could not decode) is one that cannot be read
            values = feats.to_pylist() if fmt.kind == "encoded" else _struct_rows(feats)
            for i in range(len(values)):
                why: str | None
                try:
                    value = values[i]
                except ValueError as err:  # a struct whose fields disagree with its bytes
                    value, length, why = b"", 0, str(err)
                else:
                    length, why = (0, "null image") if value is None else fmt.check_row(value)
                if why is None:
                    lengths.append(length)
                else:
                    bad.append(offset + i)
                    reasons.append(why)
        elif fmt.sequences:  # a null or empty row is named or skipped under nanPolicy, in the checks
            lens = pc.fill_null(pc.list_value_length(feats), 0).to_numpy(zero_copy_only=False)
            if pa.types.is_list(feats.type.value_type):  # steps of features: a null or non-finite value too
                lens = np.where([r is None for r in sequence_rows(feats)], 0, lens)
            null_features += int((lens == 0).sum())
            lengths.append(lens.astype(np.float64))
        else:
            null_features += feats.null_count
            lens = _lengths(feats, fmt)
            lengths.append(lens)
            if fmt.kind == "vector" and feats.null_count == 0 and len(lens) and lens.min() == lens.max():
                x = feats.flatten().to_numpy(zero_copy_only=False).reshape(len(lens), -1)
                x_bad.append(~np.isfinite(x).all(axis=1))
        offset += batch.num_rows
        if spill is None and not fmt.images and held_rows + batch.num_rows <= buffer_rows:
            held.append(batch)
            held_rows += batch.num_rows
            continue
        if spill is None:
            block_rows = BLOCK_ROWS
            if fmt.images and batch.num_rows:
                row_bytes = max(1, batch.nbytes // batch.num_rows)
                block_rows = int(np.clip(BLOCK_BYTES // row_bytes, 16, BLOCK_ROWS))
                buffer_rows = min(buffer_rows, max(block_rows, WINDOW_BYTES // row_bytes))
            spill = Spill(batch.schema, spill_dir, block_rows)
            for b in held:
                spill.write(b)
            held = []
        spill.write(batch)
    y, label_widths = stack_labels(labels)
    lens = np.concatenate([np.atleast_1d(np.asarray(v)) for v in lengths]) if lengths else np.zeros(0)
    valid_lens = lens[lens >= 0]
    rows_bad = ~finite_rows(y)
    if x_bad and sum(len(b) for b in x_bad) == len(y):
        rows_bad |= np.concatenate(x_bad)
    nonfinite = int(rows_bad.sum())
    profile = shard_profile(valid_lens, y, null_features, nonfinite, len(bad), bad[0] if bad else -1, label_widths)
    if spill is None and fmt.sequences:
        return _dense(held, fmt, y), profile
    if spill is None and not fmt.images:
        shard = _dense(held, fmt, y) if null_features == 0 and _one_length(valid_lens) else None
        return shard, profile
    if spill is None:  # an empty partition of images
        spill = Spill(pa.schema([(FEATURES, pa.binary()), (LABEL, pa.float64())]), spill_dir)
    spill.close_writing()
    if fmt.sequences:  # null and empty rows are left out under nanPolicy="skip" (the checks name them else)
        skip = np.union1d(np.flatnonzero(lens <= 0), np.flatnonzero(~finite_rows(y)))
        return SpilledShard(spill, y, fmt, skip, [], buffer_rows, lens.astype(np.int64)), profile
    if null_features or not _one_length(valid_lens):
        spill.remove()
        return None, profile
    skip = np.union1d(np.asarray(bad, np.int64), np.flatnonzero(rows_bad))
    return SpilledShard(spill, y, fmt, skip, reasons, buffer_rows), profile


def label_rows(column: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """A batch's labels as float64, and their widths: numbers ``(n,)`` (NaN for a null) and None; or, for a
    list column (vector labels), ``(n, k)`` with ``k`` the widest row, the values a narrower or null row lacks
    NaN, and each row's width (0: null). Read as whole arrays, with no Python object per row."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_list(column.type):
        return pc.fill_null(column, float("nan")).to_numpy(zero_copy_only=False), None
    offsets = column.offsets.to_numpy().astype(np.int64)  # into column.values, which ignores a slice
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    widths = np.where(valid, np.diff(offsets), 0)
    values = column.values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    y = np.full((len(column), int(widths.max(initial=0))), np.nan)
    rows = np.repeat(np.arange(len(column)), widths)
    cols = np.arange(int(widths.sum())) - np.repeat(np.cumsum(widths) - widths, widths)
    y[rows, cols] = values[np.repeat(offsets[:-1], widths) + cols]
    return y, widths


def stack_labels(batches: list[tuple[np.ndarray, np.ndarray | None]]) -> tuple[np.ndarray, np.ndarray | None]:
    """The batches of :func:`label_rows` as one array and one array of widths (None: numbers). Vector labels
    are padded with NaN to the widest row of all batches (the checks name rows of unequal width before any
    is used)."""
    if not batches:
        return np.zeros(0), None
    if batches[0][1] is None:
        return np.concatenate([y for y, _ in batches]), None
    k = max(y.shape[1] for y, _ in batches)
    y = np.concatenate([np.pad(y, ((0, 0), (0, k - y.shape[1])), constant_values=np.nan) for y, _ in batches])
    return y, np.concatenate([w for _, w in batches if w is not None])


def sequence_rows(column: pa.Array) -> np.ndarray:
    """A list column of token ids as an object array of 1-d int64 arrays (None for a null row), each a view
    of the column's values cut at its offsets; a column of steps of features (``array<array<float>>``, one
    width, checked on the driver by :func:`irbis.spark.training.check_step_widths`) as 2-d float32
    ``(steps, features)`` arrays, None for a row that holds a null or a non-finite value."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    rows = np.empty(len(column), dtype=object)
    if not len(column):
        return rows
    if pa.types.is_list(column.type.value_type):
        from irbis.kernels.blocks import ragged_rows

        for i, row in enumerate(ragged_rows(column, FEATURES).rows):
            rows[i] = None if row is None or not np.isfinite(row).all() else row.astype(np.float32, copy=False)
        return rows
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    for i in range(len(column)):
        rows[i] = values[offsets[i]:offsets[i + 1]] if valid[i] else None
    return rows


def _struct_rows(feats: pa.Array) -> Any:
    """Image structs as an indexable block of ``(H, W, C)`` views (None for a null row)."""
    from irbis.kernels.blocks import from_arrow

    return from_arrow(feats, FEATURES)


def _lengths(feats: pa.Array, fmt: InputFormat) -> np.ndarray:
    if fmt.kind == "tensor":
        lens = pc.binary_length(feats).to_numpy(zero_copy_only=False)
        return (lens // np.dtype(fmt.dtype).itemsize).astype(np.float64)
    return pc.list_value_length(feats).drop_null().to_numpy(zero_copy_only=False).astype(np.float64)


def _one_length(lens: np.ndarray) -> bool:
    return not len(lens) or lens.min() == lens.max()


def _dense(held: list[pa.RecordBatch], fmt: InputFormat, y: np.ndarray) -> Shard:
    if not held:
        return Shard(np.zeros(0, object) if fmt.sequences else np.zeros((0, 0), np.float32), y)
    feats = pa.chunked_array([b.column(FEATURES) for b in held]).combine_chunks()
    x = fmt.decode(feats)
    if fmt.sequences:
        return Shard(x, y)
    return Shard(x.reshape(len(y), -1), y)


class SpilledShard:
    """A worker's rows in a :class:`Spill`: labels in memory, features read back a batch at a time.

    ``bad`` are the rows to leave out under ``nanPolicy="skip"``: images that could not be read (``reasons``
    says why), rows with non-finite numbers, null or empty sequences. ``lengths``: each row's length, for
    sequences (their batches are cut by length before any row is read back).
    """

    def __init__(self, spill: Spill, labels: np.ndarray, fmt: InputFormat, bad: np.ndarray,
                 reasons: list[str], buffer_rows: int, lengths: np.ndarray | None = None) -> None:
        self.spill, self.labels, self.fmt, self.bad, self.reasons = spill, labels, fmt, bad, reasons
        self.buffer_rows, self.lengths = buffer_rows, lengths

    def __len__(self) -> int:
        return len(self.labels)

    def split(self, fraction: float, seed: int, nan_policy: str) -> tuple[StreamRows, StreamRows, int]:
        """Training and validation rows (the same seeded split as :func:`~irbis.train.worker_data.split_validation`),
        without the rows to skip under ``nan_policy="skip"``; and how many were skipped."""
        n = len(self)
        keep = np.ones(n, bool)
        if nan_policy == "skip":
            keep[self.bad] = False
            keep &= finite_rows(self.labels)
        ids = np.flatnonzero(keep)
        n_val = int(round(len(ids) * fraction))
        if fraction > 0 and n_val:
            perm = np.random.default_rng(seed).permutation(len(ids))
            val, train = np.sort(ids[perm[:n_val]]), np.sort(ids[perm[n_val:]])
        else:
            val, train = ids[:0], ids
        return StreamRows(self, train), StreamRows(self, val), int(n - keep.sum())

    def close(self) -> None:
        self.spill.remove()


class StreamRows(BatchedRows):
    """Some rows of a :class:`SpilledShard` (training or validation), read back in batches.

    Rows of token ids (``fmt.sequences``) are batched by length within each shuffle window once
    :meth:`use_lengths` has set how (see :mod:`irbis.train.ragged`); ``stats`` counts their padding.
    """

    def __init__(self, shard: SpilledShard, ids: np.ndarray) -> None:
        self.shard, self.ids = shard, ids
        self.kind: str | None = None  # sequences: the network's input_kind (set by use_lengths)
        self.token_budget = self.max_rows = 0
        self.stats: Any = None
        sizes = np.asarray(shard.spill.sizes, np.int64)
        self._starts = np.concatenate([[0], np.cumsum(sizes)])
        block_of = np.searchsorted(self._starts, ids, side="right") - 1
        self._by_block = [ids[block_of == b] for b in range(len(sizes))]

    def __len__(self) -> int:
        return len(self.ids)

    def labels(self) -> np.ndarray:
        return self.shard.labels[self.ids]

    def _passes(self, seed: int, rank: int, epoch: int) -> Iterator[tuple[int, np.ndarray, np.random.Generator]]:
        """(pass, a window's row ids, the pass's generator), pass after pass: blocks in a seeded permutation,
        a window of blocks (about ``buffer_rows`` rows) at a time."""
        per_window = max(1, self.shard.buffer_rows // self.shard.spill.block_rows)
        for r in itertools.count():
            rng = np.random.default_rng([seed, rank, epoch, 5, r])
            order = [b for b in rng.permutation(len(self._by_block)) if len(self._by_block[b])]
            for start in range(0, len(order), per_window):
                yield r, np.concatenate([self._by_block[b] for b in order[start:start + per_window]]), rng

    def _windows(self, seed: int, rank: int, epoch: int) -> Iterator[np.ndarray]:
        """Row ids, pass after pass, a window at a time (:meth:`_passes`), the window's rows permuted."""
        for _, ids, rng in self._passes(seed, rank, epoch):
            yield rng.permutation(ids)

    def use_lengths(self, kind: str, token_budget: int, max_rows: int) -> None:
        """Batch these rows of token ids by length: cut under ``token_budget`` padded tokens and ``max_rows``
        rows within each shuffle window, as ``kind`` (the network's input_kind) takes them."""
        from irbis.kernels.sequences import PadStats

        self.kind, self.token_budget, self.max_rows, self.stats = kind, token_budget, max_rows, PadStats()

    def _length_batches(self, ids: np.ndarray) -> list[np.ndarray]:
        """Rows ``ids`` in length batches (rows of one length keep the order of ``ids``)."""
        from irbis.kernels.sequences import length_batches

        lengths = self.shard.lengths
        assert lengths is not None  # a shard of variable-length rows records them
        plan = length_batches(lengths[ids], token_budget=self.token_budget, max_rows=self.max_rows)
        return [ids[b] for b in plan]

    def _window_batches(self, seed: int, rank: int, epoch: int) -> Iterator[tuple[int, list[np.ndarray]]]:
        """(pass, the length batches of one window, its rows permuted, in a seeded order), window after window
        (:meth:`_passes`)."""
        for r, window, rng in self._passes(seed, rank, epoch):
            batches = self._length_batches(rng.permutation(window))
            yield r, [batches[j] for j in rng.permutation(len(batches))]

    def batch_count(self, seed: int, rank: int, epoch: int) -> int:
        """The length batches of one pass over these rows in ``epoch`` (lengths only: nothing is read)."""
        count = 0
        for r, batches in self._window_batches(seed, rank, epoch):
            if r > 0 or not len(self):
                break
            count += len(batches)
        return count

    def order(self, batch_size: int, count: int, seed: int, rank: int, epoch: int) -> Iterator[np.ndarray]:
        """The row ids of ``count`` batches of ``batch_size``: every row once per pass over the data, the
        batches after the first pass drawn from the next (so that every worker takes ``count`` steps).
        Sequences: length batches window by window (:meth:`use_lengths`), the next pass's after the first."""
        if self.kind is not None:
            made = 0
            for _, batches in self._window_batches(seed, rank, epoch):
                for b in batches[:count - made]:
                    yield b
                made += min(len(batches), count - made)
                if made >= count:
                    return
            return
        carry = np.zeros(0, np.int64)
        made = 0
        for window in self._windows(seed, rank, epoch):
            carry = np.concatenate([carry, window])
            while len(carry) >= batch_size and made < count:
                yield carry[:batch_size]
                carry = carry[batch_size:]
                made += 1
            if made >= count:
                return

    def read(self, ids: np.ndarray, reader: BlockCache) -> pa.Array:
        """The features of rows ``ids`` (in that order), from the spill."""
        blocks = np.searchsorted(self._starts, ids, side="right") - 1
        pieces, where = [], np.empty(len(ids), np.int64)
        pos = 0
        for b in np.unique(blocks):
            sel = np.flatnonzero(blocks == b)
            pieces.append(reader.get(int(b)).column(FEATURES).take(pa.array(ids[sel] - self._starts[b])))
            where[sel] = np.arange(pos, pos + len(sel))
            pos += len(sel)
        merged = pa.concat_arrays(pieces) if len(pieces) > 1 else pieces[0]
        return merged.take(pa.array(where)) if len(pieces) > 1 else merged

    def batches(self, plan: BatchPlan, augment: bool = True,
                hook: Callable[[np.ndarray, int], np.ndarray] | None = None
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Decoded ``(xb, yb)`` for batches ``start..steps * rounds - 1`` of the plan's epoch (see
        :meth:`order`); images drawn with the augmentation when ``augment``, then ``hook(batch, i)`` when given
        (the estimator's ``augment`` callable). Runs on one thread (give it its own generator)."""
        seed, rank, epoch, device, label_dtype = plan.seed, plan.rank, plan.epoch, plan.device, plan.label_dtype
        cache = BlockCache(self.shard.spill.reader_copy(), keep=2 * max(1, self.shard.buffer_rows
                                                                       // self.shard.spill.block_rows) + 2)
        order = itertools.islice(enumerate(self.order(plan.batch_size, plan.steps * plan.rounds, seed, rank, epoch)),
                                 plan.start, None)
        if self.kind is not None:  # variable-length rows: augmented before they are padded
            from irbis.train.ragged import augment_rows

            for i, ids in order:
                rows_hook = None if hook is None else partial(augment_rows, hook, i=i)
                yield self._tensors(ids, cache, device, label_dtype, rows_hook)
            return
        draws = (seed, rank, epoch) if augment and self.shard.fmt.augmentation else None
        processes = plan.feed_processes if self.shard.fmt.images else 0
        for i, ids, x in self._decoded_batches(order, cache, draws, processes):
            xb, yb = self._tensors(ids, x, "cpu" if hook else device, label_dtype)
            if hook is not None:
                xb = torch.from_numpy(np.require(hook(xb.numpy(), i), np.float32, ["C", "W"]))
                xb, yb = (xb.to(device), yb.to(device)) if device != "cpu" else (xb, yb)
            yield xb, yb

    def _decoded_batches(self, order: Iterator[tuple[int, np.ndarray]], cache: BlockCache,
                         draws: tuple[int, int, int] | None, processes: int
                         ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(i, ids, inputs)`` for each batch of ``order``, decoded (``draws``: augmented, see
        :func:`decode_rows`) on the task's threads, or in ``processes`` worker processes
        (:mod:`irbis.kernels.feed`) up to twice as many batches ahead: the same batches either way."""
        if not processes:
            for i, ids in order:
                yield i, ids, self._decoded(ids, cache, draws)
            return
        from irbis.kernels.feed import feed

        held: deque[tuple[int, np.ndarray]] = deque()

        def jobs() -> Iterator[tuple[np.ndarray, pa.Array]]:
            for i, ids in order:
                held.append((i, ids))
                yield ids, self.read(ids, cache)

        for x in feed(processes).map(partial(decode_rows, self.shard.fmt, draws), jobs()):
            yield (*held.popleft(), x)

    def step_count(self, batch_size: int, seed: int, rank: int, epochs: int) -> int:
        """Batches of ``batch_size`` in one pass over these rows; sequences: the length batches of a pass,
        the most of any of the ``epochs`` (their windows differ by epoch)."""
        if self.kind is None:
            return -(-len(self) // batch_size)
        return max((self.batch_count(seed, rank, e) for e in range(epochs)), default=0)

    def sample(self, positions: np.ndarray, device: str,
               label_dtype: Any) -> Callable[[int, int, int], Iterator[tuple[Any, torch.Tensor]]]:
        """The rows at ``positions`` (of these rows), read back ``size`` at a time by ``batches(lo, hi, size)``."""
        picked = self.ids[positions]
        return lambda lo, hi, b: self.take(picked[lo:hi], b, device, label_dtype)

    def nonfinite_rows(self) -> int:
        """0: rows that are not finite were named or left out when the shard was read."""
        return 0

    def in_order(self, batch_size: int, device: str, label_dtype: Any,
                 limit: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The rows in file order, unaugmented, ``batch_size`` at a time (up to ``limit`` rows); sequences in
        length batches of a window of rows at a time."""
        ids = self.ids if limit is None else self.ids[:limit]
        if self.kind is None:
            return self.take(ids, batch_size, device, label_dtype)
        cache = BlockCache(self.shard.spill.reader_copy(), keep=2)
        window = max(self.shard.buffer_rows, 1)
        return (self._tensors(b, cache, device, label_dtype)
                for s in range(0, len(ids), window) for b in self._length_batches(ids[s:s + window]))

    def take(self, ids: np.ndarray, batch_size: int, device: str,
             label_dtype: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Rows ``ids`` (of the shard), in that order, unaugmented, ``batch_size`` at a time."""
        cache = BlockCache(self.shard.spill.reader_copy(), keep=2)
        for s in range(0, len(ids), batch_size):
            part = ids[s:s + batch_size]
            yield self._tensors(part, self._decoded(part, cache, None), device, label_dtype)

    def _decoded(self, ids: np.ndarray, cache: BlockCache, draws: tuple[int, int, int] | None) -> np.ndarray:
        """Rows ``ids`` decoded on the task's threads (``draws``: augmented, see :func:`decode_rows`)."""
        return decode_rows(self.shard.fmt, draws, (ids, self.read(ids, cache)))

    def _tensors(self, ids: np.ndarray, made: Any, device: str, label_dtype: Any,
                 rows_hook: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None) -> tuple[Any, torch.Tensor]:
        """The batch of rows ``ids`` as tensors on ``device``: ``made`` is their decoded inputs, or, for
        variable-length rows, the :class:`BlockCache` to read them from."""
        fmt = self.shard.fmt
        if self.kind is not None:
            from irbis.train.ragged import make_batch

            rows = list(fmt.decode(self.read(ids, made)))
            xs, stats = make_batch(rows if rows_hook is None else rows_hook(rows), self.kind, device)
            self.stats.add(stats)
            return xs, torch.from_numpy(np.ascontiguousarray(self.shard.labels[ids], label_dtype)).to(device)
        x = made
        if fmt.shape and x.shape[1:] != tuple(fmt.shape):
            x = x.reshape(len(ids), *fmt.shape)
        xb = torch.from_numpy(np.require(x, np.float32, ["C", "W"]))
        yb = torch.from_numpy(np.ascontiguousarray(self.shard.labels[ids], label_dtype))
        if device != "cpu":
            return xb.pin_memory().to(device, non_blocking=True), yb.to(device)
        return xb, yb


def decode_rows(fmt: InputFormat, draws: tuple[int, int, int] | None, job: tuple[np.ndarray, pa.Array]) -> np.ndarray:
    """``job``'s rows (their ids in the worker's partition, their features column) as one float32 array;
    ``draws`` = (seed, rank, epoch) augments each row from its own generator, seeded by them and the row's
    id, so that any thread or process makes the same batch. Raises ``ValueError`` naming the rows for a
    value that cannot be read. A module-level function: the feed's worker processes run it too."""
    ids, column = job
    rngs = None if draws is None else [np.random.default_rng([*draws, 6, int(r)]) for r in ids]
    try:
        return fmt.decode(column, rngs)
    except ValueError as err:
        raise ValueError(f"{err} (row {int(ids[0])}.. of this worker's partition)") from err


class BlockCache:
    """The last ``keep`` blocks read from a spill (a window and the one before it)."""

    def __init__(self, spill: Spill, keep: int) -> None:
        self.spill, self.keep = spill, keep
        self._blocks: OrderedDict[int, pa.RecordBatch] = OrderedDict()

    def get(self, b: int) -> pa.RecordBatch:
        if b in self._blocks:
            self._blocks.move_to_end(b)
            return self._blocks[b]
        block = self.spill.block(b)
        self._blocks[b] = block
        while len(self._blocks) > self.keep:
            self._blocks.popitem(last=False)
        return block


__all__ = ["BLOCK_ROWS", "FEATURES", "INPUT_KINDS", "LABEL", "BlockCache", "InputFormat", "Spill",
           "SpilledShard", "StreamRows", "label_rows", "read_partition", "stack_labels"]
