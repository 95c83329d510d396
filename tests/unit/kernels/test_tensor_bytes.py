"""Tensor bytes as a block: zero-copy reading, nulls, lengths that do not fit, and the writer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from irbis.kernels.batching import network_batch
from irbis.kernels.blocks import Tensor, from_arrow, rows_in, tensor_bytes, to_arrow


def test_rows_are_read_as_one_view_of_the_arrow_buffer_and_nulls_kept():
    x = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
    column = tensor_bytes(x, np.array([True, False, True, True]))
    assert column.null_count == 1 and len(column[1].as_py() or b"") == 0
    block = from_arrow(column.slice(1), "x")
    batch = network_batch(block, "x", [2, 4])
    assert batch.valid.tolist() == [False, True, True]
    np.testing.assert_array_equal(batch.values, x[1:])
    assert np.shares_memory(batch.values, np.frombuffer(column.buffers()[2], np.uint8))


def test_null_rows_holding_bytes_are_skipped():
    x = (np.ones((2, 4)) * [[1], [2]]).astype(np.float32)
    raw = pa.array([x[0].tobytes(), b"junk", x[1].tobytes()], pa.binary())
    column = pa.Array.from_buffers(pa.binary(), 3, [pa.array([True, False, True]).buffers()[1], *raw.buffers()[1:]])
    np.testing.assert_array_equal(network_batch(from_arrow(column), "x", [4]).values, x)


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_small_types_are_cast_to_the_network_type(dtype):
    x = np.arange(16, dtype=dtype).reshape(2, 8)
    batch = network_batch(from_arrow(tensor_bytes(x)), "x", [2, 4], input_dtype=dtype)
    assert batch.values.dtype == np.float32
    np.testing.assert_array_equal(batch.values.reshape(2, 8), x.astype(np.float32))
    as_int = network_batch(from_arrow(tensor_bytes(x)), "x", [8], input_dtype=dtype, dtype=np.int64)
    assert as_int.values.dtype == np.int64


def test_a_row_of_another_length_names_the_column_shape_and_bytes():
    column = pa.array([bytes(32), bytes(30)], pa.binary())
    with pytest.raises(ValueError, match=r"Net: rows of column 'px' have shape \[7.5\].*expected: \[8\].*"
                                         r"30 bytes, but \[8\] values of float32 take 32 bytes"):
        network_batch(from_arrow(column), "px", [8], stage="Net")
    with pytest.raises(ValueError, match=r"'px' holds tensor bytes.*set inputShape"):
        network_batch(from_arrow(column), "px", None, stage="Net")


def test_pandas_bytes_and_tensor_blocks_round_trip():
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    block = rows_in([r.tobytes() for r in x] + [None], "x")
    np.testing.assert_array_equal(network_batch(block, "x", [5]).values, x)
    column = to_arrow(Tensor(x, np.ones(3, bool)), pa.binary())
    assert column.to_pylist() == [r.tobytes() for r in x]
    with pytest.raises(ValueError, match="3 rows of values, but the mask marks 2"):
        tensor_bytes(x, np.array([True, False, True]))


@pytest.mark.parametrize("values", [[0.0, 256.0], [-1.0, 3.0], [0.5, 2.0]])
def test_values_that_uint8_would_wrap_or_truncate_are_refused(values):
    with pytest.raises(ValueError, match=r"do not fit uint8 \(whole numbers in 0\.\.255\)"):
        tensor_bytes(np.array([values], np.float32), dtype="uint8")
    fits = tensor_bytes(np.array([[0.0, 255.0]], np.float32), dtype="uint8")
    assert fits.to_pylist() == [bytes([0, 255])]
