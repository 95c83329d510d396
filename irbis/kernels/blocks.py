"""Column blocks: a batch of rows as a kernel sees it, with no Python object per value.

A stage's kernel (a :data:`BatchFn`) takes a dict of blocks, one per input column, and returns a dict
of blocks, one per output column. The same function runs in Spark (on Arrow batches), on pandas frames
and in the HTTP server.

* :class:`Tensor`: a numeric column (vectors, arrays, nested arrays) as one ``(M, *shape)`` array of
  its M non-null rows, plus the validity mask of all N rows.
* :class:`Images`: image structs. The pixels stay in the batch's one Arrow buffer; each non-null row
  is a zero-copy ``(H, W, C)`` view, and a batch of equally sized images is one ``(M, H, W, C)`` view.
* :class:`Binary`: a binary column (encoded files, or tensor bytes: :func:`tensor_bytes`) as zero-copy
  ``memoryview`` slices of one buffer.
* :class:`Ragged`: a column of sequences whose length varies per row (``array<int>`` token ids or
  ``array<array<float>>`` steps x features), read so when the stage asks for it: one view per row.
* any other column: a numpy array (``object`` dtype with ``None`` for nulls of strings and structs).

:func:`from_arrow` and :func:`to_arrow` convert between blocks and Arrow arrays. The Arrow buffers that
Spark sends become numpy views, and output blocks become Arrow buffers: one copy per output column at
most, never one per row.

Examples
--------
>>> import pyarrow as pa
>>> block = from_arrow(pa.array([[1.0, 2.0], None, [3.0, 4.0]], pa.list_(pa.float32())))
>>> block.values.tolist(), block.valid.tolist()
([[1.0, 2.0], [3.0, 4.0]], [True, False, True])
>>> to_arrow(Tensor(block.values * 2, block.valid), pa.list_(pa.float32())).to_pylist()
[[2.0, 4.0], None, [6.0, 8.0]]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from irbis.kernels.image.decode import IMAGE_FIELDS, image_view, ocv_mode

__all__ = ["BatchFn", "Binary", "Images", "Prepared", "Ragged", "ragged_rows", "Tensor", "as_block", "block_to_rows",
           "bounded_slices", "stack_rows", "flat_rows", "from_arrow", "from_rows", "rows_in", "run_steps",
           "tensor_bytes", "to_arrow"]

#: A stage's kernel: a dict of input blocks (one per column) to a dict of output blocks.
BatchFn = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class Tensor:
    """The non-null rows of a numeric column as one array.

    Attributes
    ----------
    values : ndarray, shape (M, *shape)
        The M rows where ``valid`` is true, in order.
    valid : ndarray of bool, shape (N,)
        Which of the batch's N rows are non-null.
    """

    values: np.ndarray
    valid: np.ndarray

    def __post_init__(self) -> None:
        if len(self.values) != int(self.valid.sum()):
            raise ValueError(f"a Tensor block holds {len(self.values)} rows but its mask marks "
                             f"{int(self.valid.sum())} valid rows")

    def __len__(self) -> int:
        return len(self.valid)


@dataclass
class Images:
    """Image structs whose pixels stay in one buffer (see :func:`irbis.kernels.image.decode.image_view`).

    ``images[i]`` (and iterating) gives an ``(H, W, C)`` read-only view or ``None`` for a null
    image; a struct whose fields do not agree raises ``ValueError`` when its row is reached, so a
    kernel can report that row alone.
    """

    data: Any
    offsets: np.ndarray
    height: np.ndarray
    width: np.ndarray
    channels: np.ndarray
    mode: np.ndarray
    origin: np.ndarray
    valid: np.ndarray

    def __len__(self) -> int:
        return len(self.valid)

    def image(self, i: int) -> np.ndarray | None:
        """Row ``i`` as an ``(H, W, C)`` view, ``None`` when null."""
        if not self.valid[i]:
            return None
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        return image_view(self.data[start:stop], int(self.height[i]), int(self.width[i]),
                          int(self.channels[i]), int(self.mode[i]), self.origin[i])

    def __getitem__(self, i: int) -> np.ndarray | None:
        return self.image(i)

    def __iter__(self) -> Iterator[np.ndarray | None]:
        return (self.image(i) for i in range(len(self.valid)))

    @classmethod
    def from_arrays(cls, images: Sequence[np.ndarray | None],
                    origins: Sequence[str | None] | None = None) -> "Images":
        """Pack ``(H, W[, C])`` arrays (``None`` for nulls) into one buffer: the only pixel copy."""
        n = len(images)
        valid = np.array([img is not None for img in images], bool)
        shapes = np.zeros((n, 3), np.int32)
        modes = np.zeros(n, np.int32)
        sizes = np.zeros(n + 1, np.int64)
        for i, img in enumerate(images):
            if img is not None:
                img = img[:, :, None] if img.ndim == 2 else img
                shapes[i] = img.shape
                modes[i] = ocv_mode(img.dtype, img.shape[2])
                sizes[i + 1] = img.nbytes
        offsets = np.cumsum(sizes)
        data = np.empty(int(offsets[-1]), np.uint8)
        for i, img in enumerate(images):
            if img is not None:
                data[offsets[i]:offsets[i + 1]] = np.ascontiguousarray(img).reshape(-1).view(np.uint8)
        origin = np.array(list(origins) if origins is not None else [""] * n, dtype=object)
        return cls(data, offsets, shapes[:, 0], shapes[:, 1], shapes[:, 2], modes, origin, valid)


@dataclass
class Prepared:
    """Images already preprocessed into a network's input (N, C, H, W) float32, every row valid: what an
    image network stage runs on without preprocessing again (LIME's masked inputs,
    :func:`irbis.kernels.image.network_input.masked_inputs`)."""

    values: np.ndarray

    @property
    def valid(self) -> np.ndarray:
        return np.ones(len(self.values), bool)

    def __len__(self) -> int:
        return len(self.values)


@dataclass
class Binary:
    """A binary column: row ``i`` is a zero-copy ``memoryview`` (``None`` when null)."""

    data: Any
    offsets: np.ndarray
    valid: np.ndarray
    _view: memoryview = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._view = memoryview(self.data) if self.data is not None else memoryview(b"")

    def __len__(self) -> int:
        return len(self.valid)

    def __getitem__(self, i: int) -> memoryview | None:
        return self._view[int(self.offsets[i]):int(self.offsets[i + 1])] if self.valid[i] else None

    def __iter__(self) -> Iterator[memoryview | None]:
        return (self[i] for i in range(len(self.valid)))


@dataclass
class Ragged:
    """A column of sequences whose first axis varies per row: one array per row (a view of the batch's one
    buffer), ``None`` for a null row; ``errors`` holds why a row cannot be used (a null inside it), else None."""

    rows: list[np.ndarray | None]
    errors: list[str | None]

    @property
    def valid(self) -> np.ndarray:
        return np.array([r is not None for r in self.rows], bool)

    def __len__(self) -> int:
        return len(self.rows)


def ragged_rows(arr: pa.Array | pa.ChunkedArray, column: str = "column") -> Ragged:
    """An Arrow column of ``array<int>`` (token ids) or ``array<array<number>>`` (steps x features, one width)
    as a :class:`Ragged` block, without a Python object per value."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_null(arr.type):  # no row, or only nulls, from Python values
        return Ragged([None] * len(arr), ["null row"] * len(arr))
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise TypeError(f"column {column!r} has type {arr.type}; a variable-length column holds arrays")
    valid, offsets = _valid(arr), _offsets(arr)
    steps = arr.flatten()
    nested = pa.types.is_list(steps.type) or pa.types.is_large_list(steps.type)
    if nested:  # steps x features: each step's values, one width for all
        bad_step = ~_valid(steps)
        step_offsets = _offsets(steps)
        widths = np.diff(step_offsets)[~bad_step]
        width = int(widths[0]) if len(widths) else 0
        if len(widths) and (widths != width).any():
            raise ValueError(f"column {column!r}: steps have different widths ({width} and "
                             f"{int(widths[widths != width][0])} values); every step of a sequence needs "
                             f"the same number of features")
        values_arr = steps.flatten()
        starts = step_offsets - step_offsets[0]
    else:
        bad_step = np.zeros(len(steps), bool)
        values_arr, width, starts = steps, 1, np.arange(len(steps) + 1)
    null_value = ~_valid(values_arr)
    values = values_arr.to_numpy(zero_copy_only=False)
    if null_value.any():
        values = np.where(null_value, 0, values).astype(values_arr.type.to_pandas_dtype())
    rows: list[np.ndarray | None] = []
    errors: list[str | None] = []
    base = int(offsets[0]) if len(offsets) else 0
    for i in range(len(arr)):
        start, stop = int(offsets[i]) - base, int(offsets[i + 1]) - base
        reason = ("null row" if not valid[i] else "null step" if bad_step[start:stop].any()
                  else "null value" if null_value[starts[start]:starts[stop]].any() else None)
        errors.append(reason)
        if reason:
            rows.append(None)
            continue
        row = values[starts[start]:starts[stop]]
        rows.append(row.reshape(stop - start, width) if nested else row)
    return Ragged(rows, errors)


# -- Arrow to blocks --------------------------------------------------------------------------------
def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), bool)
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _is_image_struct(dtype: pa.DataType) -> bool:
    return pa.types.is_struct(dtype) and all(dtype.get_field_index(f) >= 0 for f in IMAGE_FIELDS)


def _is_tensor(dtype: pa.DataType) -> bool:
    while pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        dtype = dtype.value_type
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype)


def _offsets(arr: pa.Array) -> np.ndarray:
    """The offsets of a (large) list or binary array, relative to its (sliced) values."""
    width = 8 if pa.types.is_large_list(arr.type) or pa.types.is_large_binary(arr.type) else 4
    raw = np.frombuffer(arr.buffers()[1], np.int32 if width == 4 else np.int64)
    return raw[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)


def _tensor(arr: pa.Array, column: str) -> Tensor:
    valid = _valid(arr)
    shape: list[int] = []
    level = arr
    while isinstance(level, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        if isinstance(level, pa.FixedSizeListArray):
            width = level.type.list_size
            keep = _valid(level) if level is not arr else valid
            level = level.flatten() if level.null_count == 0 else level.filter(pa.array(keep)).flatten()
        else:
            lengths = np.diff(_offsets(level))
            keep = _valid(level) if level is not arr else valid
            present = lengths[keep]
            width = int(present[0]) if len(present) else 0
            if len(present) and (present != width).any():
                other = int(present[present != width][0])
                raise ValueError(f"column {column!r}: rows have different lengths ({width} and "
                                 f"{other} values); a tensor column needs one shape per row (a network stage takes "
                                 f"sequences of varying length with variableLength=True)")
            level = level.flatten()
        shape.append(width)
    rows = int(valid.sum())
    values = level.to_numpy(zero_copy_only=False) if level.null_count else level.to_numpy()
    return Tensor(values.reshape(rows, *shape), valid)


def _images(arr: pa.StructArray) -> Images:
    data = arr.field("data")
    valid = _valid(arr) & _valid(data)
    body = data.buffers()[2]
    ints = [arr.field(f).to_numpy(zero_copy_only=False) for f in ("height", "width", "nChannels", "mode")]
    ints = [np.nan_to_num(x.astype(np.float64), nan=0).astype(np.int64) if x.dtype.kind == "f" else x
            for x in ints]
    origin = arr.field("origin").to_numpy(zero_copy_only=False)
    buffer = np.frombuffer(body, np.uint8) if body is not None else np.zeros(0, np.uint8)
    height, width, channels, mode = ints
    return Images(buffer, _offsets(data), height, width, channels, mode, origin, valid)


def from_arrow(arr: pa.Array | pa.ChunkedArray, column: str = "column", ragged: bool = False) -> Any:
    """Turn one Arrow column into its block (see the module docstring), without per-row copies; with
    ``ragged``, a column of variable-length sequences (:class:`Ragged`)."""
    if ragged:
        return ragged_rows(arr, column)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if _is_image_struct(arr.type):
        return _images(arr)
    if _is_tensor(arr.type) and not pa.types.is_integer(arr.type) and not pa.types.is_floating(arr.type):
        return _tensor(arr, column)
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
        return Binary(arr.buffers()[2], _offsets(arr), _valid(arr))
    return arr.to_numpy(zero_copy_only=False)


# -- blocks to Arrow --------------------------------------------------------------------------------
def _list_array(values: np.ndarray, valid: np.ndarray, dtype: pa.DataType) -> pa.Array:
    width = int(np.prod(values.shape[1:])) if values.ndim > 1 else 1
    counts = np.where(valid, width, 0)
    offsets = np.zeros(len(valid) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    flat = pa.array(np.ascontiguousarray(values).reshape(-1).astype(
        dtype.value_type.to_pandas_dtype(), copy=False))
    mask = None if valid.all() else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(offsets), flat, type=dtype, mask=mask)


def _image_array(block: Images, dtype: pa.StructType) -> pa.Array:
    offsets = pa.array(block.offsets.astype(np.int32))
    data = pa.BinaryArray.from_buffers(pa.binary(), len(block), [None, offsets.buffers()[1],
                                                                   pa.py_buffer(block.data)])
    children = {"origin": pa.array(block.origin.tolist(), pa.string()), "data": data}
    for name, values in (("height", block.height), ("width", block.width),
                         ("nChannels", block.channels), ("mode", block.mode)):
        children[name] = pa.array(np.asarray(values, np.int32))
    arrays = [children[f.name].cast(f.type) for f in dtype]
    return pa.StructArray.from_arrays(arrays, fields=list(dtype),
                                      mask=None if block.valid.all() else pa.array(~block.valid))


def tensor_bytes(values: np.ndarray, valid: np.ndarray | None = None, dtype: Any = None) -> pa.Array:
    """Rows of ``values`` as a binary column of raw little-endian tensor bytes (no copy per row).

    Parameters
    ----------
    values : ndarray, shape (M, *shape)
        The tensors of the M non-null rows.
    valid : ndarray of bool, shape (N,), optional
        Which of the N rows are non-null (all, when omitted); null rows hold no bytes.
    dtype : numpy dtype, optional
        Element type to write (``float32``, ``float16`` or ``uint8``); ``values``' own when omitted.

    Returns
    -------
    pyarrow.Array
        ``binary`` (``large_binary`` past 2 GiB), each non-null row ``prod(shape) * itemsize`` bytes.

    Examples
    --------
    >>> import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    >>> x = np.zeros((4, 3, 8, 8), np.float32)
    >>> column = tensor_bytes(x)
    >>> column.type, len(column[0].as_py())
    (DataType(binary), 768)
    >>> pq.write_table(pa.table({"pixels": column}), "/dev/null")
    """
    values = np.asarray(values)
    item = np.dtype(dtype or values.dtype).newbyteorder("<")
    valid = np.ones(len(values), bool) if valid is None else np.asarray(valid, bool)
    if int(valid.sum()) != len(values):
        raise ValueError(f"tensor_bytes: {len(values)} rows of values, but the mask marks {int(valid.sum())} "
                         f"valid rows")
    _check_fits(values, item)
    flat = np.ascontiguousarray(values, dtype=item).reshape(-1)
    row_bytes = flat.nbytes // max(len(values), 1)
    large = flat.nbytes >= 2 ** 31
    offsets = np.zeros(len(valid) + 1, np.int64 if large else np.int32)
    np.cumsum(np.where(valid, row_bytes, 0), out=offsets[1:])
    bitmap = None if valid.all() else pa.array(valid).buffers()[1]  # Arrow's validity bits: 1 = non-null
    return pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), len(valid),
                                 [bitmap, pa.py_buffer(offsets), pa.py_buffer(flat.view(np.uint8))])


def _check_fits(values: np.ndarray, item: np.dtype) -> None:
    """Refuse values that an integer element type would wrap around or truncate (e.g. 300 or 0.5 as uint8)."""
    if item.kind not in "iu" or values.dtype == item or not values.size:
        return
    info = np.iinfo(item)
    low, high = values.min(), values.max()
    if low < info.min or high > info.max or (values.dtype.kind == "f" and not np.array_equal(values, np.rint(values))):
        raise ValueError(f"tensor_bytes: values from {low} to {high} do not fit {item.name} (whole numbers in "
                         f"{info.min}..{info.max}); scale or round them first, or write float32")


def to_arrow(block: Any, dtype: pa.DataType) -> pa.Array:
    """Turn a block (or a sequence of Python values) into an Arrow array of type ``dtype``."""
    if isinstance(block, Tensor):
        if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
            return tensor_bytes(block.values, block.valid).cast(dtype)
        if not pa.types.is_list(dtype):
            raise TypeError(f"a Tensor block becomes a list or binary column, not {dtype}")
        return _list_array(block.values, block.valid, dtype)
    if isinstance(block, Images):
        return _image_array(block, dtype)
    if isinstance(block, np.ndarray) and block.dtype != object:
        return pa.array(block, type=dtype)
    return pa.array(list(block), type=dtype)


def bounded_slices(rows: int, run: Callable[[int, int], Any], max_bytes: int,
                   first: int = 64) -> Iterator[Any]:
    """Run ``run(start, stop)`` over ``rows`` rows in slices whose results stay under ``max_bytes``.

    The first slice has ``first`` rows; later slices are sized from the bytes per row measured so
    far (``result.nbytes``), so a batch of small rows stays whole and a batch of large images is
    cut into several. Every result is yielded as it is made.
    """
    start, step = 0, max(1, first)
    while start < rows:
        stop = min(rows, start + step)
        result = run(start, stop)
        yield result
        step = max(1, int(max_bytes // max(result.nbytes / (stop - start), 1.0)))
        start = stop


# -- Python rows (pandas, JSON) --------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A pandas cell as Arrow takes it: Spark ML vectors and numpy arrays become lists or arrays."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    if hasattr(value, "toArray"):
        return value.toArray()
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: (bytes(v) if isinstance(v, (bytearray, memoryview)) else v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return value.asDict()
    return value


def mixed_shapes(column: str, shapes: set[tuple[int, ...]]) -> str | None:
    """The error message for a tensor column whose rows have more than one shape, or None."""
    if len(shapes) < 2:
        return None
    a, b = sorted(shapes)[:2]
    return (f"column {column!r}: rows have different shapes ({list(a)} and {list(b)}); a tensor column "
            f"needs one shape per row (a network stage takes sequences of varying length with "
            f"variableLength=True)")


def rows_in(values: Sequence[Any], column: str = "column", ragged: bool = False) -> Any:
    """Turn a column of Python values (a pandas column, JSON rows) into its block (with ``ragged``, a
    :class:`Ragged` block of variable-length sequences). A NaN inside a sequence is a missing value, as
    pandas holds one (a Spark array with a null element comes to pandas as floats with NaN), so its row gets
    the ``"null value"`` reason the Spark path gives it."""
    plain = [_plain(v) for v in values]
    if ragged:
        return ragged_rows(pa.array([None if v is None else np.asarray(v).tolist() for v in plain], from_pandas=True),
                           column)
    sample = next((v for v in plain if v is not None), None)
    if isinstance(sample, np.ndarray) and sample.dtype != object:
        valid = np.array([v is not None for v in plain], bool)
        rows = [v for v in plain if v is not None]
        message = mixed_shapes(column, {r.shape for r in rows})
        if message:
            raise ValueError(message)
        return Tensor(np.stack(rows) if rows else np.zeros((0,), np.float32), valid)
    return from_arrow(pa.array(plain), column)


def as_block(value: Any, column: str = "column") -> Any:
    """An output block as the next kernel would receive it from Arrow (lists of rows become blocks)."""
    if isinstance(value, (Tensor, Images)) or hasattr(value, "dtype"):
        return value
    return rows_in(value, column)


def run_steps(steps: Sequence[tuple[Sequence[str], BatchFn]], blocks: dict[str, Any]) -> dict[str, Any]:
    """Run kernels one after another on the same blocks: each ``(columns, fn)`` step reads its
    columns from what the input and the earlier steps gave; return every block, inputs included."""
    blocks = dict(blocks)
    for columns, fn in steps:
        out = fn({c: blocks[c] for c in columns})
        blocks.update({c: as_block(v, c) for c, v in out.items()})
    return blocks


def block_to_rows(block: Any) -> list[Any]:
    """A block as Python rows, the pandas representation of each Irbis column kind.

    Tensors give one numpy array per row, images one Spark image struct (a dict), and ``None`` for
    nulls.
    """
    if isinstance(block, Tensor):
        return from_rows(block.values, block.valid)
    if isinstance(block, Images):
        return [None if not ok else {"origin": o, "height": int(h), "width": int(w),
                                     "nChannels": int(c), "mode": int(m),
                                     "data": bytes(block.data[s:e])}
                for ok, o, h, w, c, m, s, e in zip(block.valid, block.origin, block.height,
                                                   block.width, block.channels, block.mode,
                                                   block.offsets[:-1], block.offsets[1:])]
    if isinstance(block, Binary):
        return [None if v is None else bytes(v) for v in block]
    return list(block)


def flat_rows(values: np.ndarray | None) -> np.ndarray:
    """``(M, ...)`` outputs as ``(M, D)`` rows (``(0, 1)`` for none), the layout of a vector column."""
    if values is None or len(values) == 0:
        return np.zeros((0, 1), np.float32)
    return values.reshape(len(values), -1)


def stack_rows(rows: Sequence[np.ndarray | None]) -> Any:
    """Per-row arrays (``None`` for nulls) as a :class:`Tensor` when they share a shape.

    Rows of different shapes stay a list (an Arrow list column takes ragged rows).
    """
    valid = np.array([r is not None for r in rows], bool)
    present = [r for r in rows if r is not None]
    if len({r.shape for r in present}) > 1:
        return list(rows)
    if not present:
        return Tensor(np.zeros((0, 1), np.float32), valid)
    return Tensor(np.stack(present), valid)


def from_rows(values: np.ndarray, valid: np.ndarray) -> list[np.ndarray | None]:
    """Give each of N rows its output row from the M valid ones, ``None`` where the input was null."""
    rows: list[np.ndarray | None] = [None] * len(valid)
    for i, out in zip(np.flatnonzero(valid), values):
        rows[i] = out
    return rows
