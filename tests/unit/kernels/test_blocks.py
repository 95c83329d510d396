"""Column blocks: Arrow <-> numpy without per-row copies, nulls kept, byte-bounded slices."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from skimage import data as skdata

from irbis.kernels.blocks import (
    Binary,
    Images,
    Tensor,
    block_to_rows,
    bounded_slices,
    from_arrow,
    rows_in,
    stack_rows,
    to_arrow,
)
from irbis.kernels.image.decode import array_to_struct

IMAGE_TYPE = pa.struct([("origin", pa.string()), ("height", pa.int32()), ("width", pa.int32()),
                        ("nChannels", pa.int32()), ("mode", pa.int32()), ("data", pa.binary())])


def test_tensor_from_list_column_is_a_view_of_the_arrow_buffer():
    arr = pa.array([[1.0, 2.0], None, [3.0, 4.0]], pa.list_(pa.float32()))
    block = from_arrow(arr)
    assert block.valid.tolist() == [True, False, True] and block.values.shape == (2, 2)
    assert np.shares_memory(block.values, np.frombuffer(arr.values.buffers()[1], np.float32))
    assert to_arrow(block, pa.list_(pa.float32())).to_pylist() == arr.to_pylist()


def test_tensor_of_a_sliced_and_nested_column():
    arr = pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]], None, [[9, 10], [11, 12]]],
                   pa.list_(pa.list_(pa.float64())))
    block = from_arrow(arr.slice(1, 3))
    assert block.values.shape == (2, 2, 2) and block.valid.tolist() == [True, False, True]
    assert block.values[1, 1].tolist() == [11.0, 12.0]


def test_ragged_rows_name_the_column():
    with pytest.raises(ValueError, match=r"column 'v': rows have different lengths \(2 and 3"):
        from_arrow(pa.array([[1.0, 2.0], [1.0, 2.0, 3.0]]), "v")


def test_images_round_trip_with_nulls_and_origins():
    cat, coins = skdata.chelsea()[:, :, ::-1], skdata.coins()
    block = Images.from_arrays([cat, None, coins], ["cat", None, "coins"])
    arr = to_arrow(block, IMAGE_TYPE)
    assert arr.null_count == 1 and arr.to_pylist()[0]["height"] == 300
    back = from_arrow(arr)
    np.testing.assert_array_equal(back[0], cat)
    assert back[1] is None and back[2].shape == (303, 384, 1)
    rows = block_to_rows(back)
    assert rows[0] == array_to_struct(np.ascontiguousarray(cat), "cat") and rows[1] is None


def test_a_bad_struct_fails_its_row_alone():
    good = array_to_struct(np.zeros((2, 2, 3), np.uint8), "ok")
    bad = {**good, "origin": "bad", "mode": 0}
    block = rows_in([good, bad], "image")
    assert block[0].shape == (2, 2, 3)
    with pytest.raises(ValueError, match="image 'bad': mode 0 does not match nChannels 3"):
        block[1]


def test_binary_rows_are_memoryviews():
    block = from_arrow(pa.array([b"abc", None, b""]))
    assert isinstance(block, Binary) and block[0] == b"abc" and block[1] is None and block[2] == b""
    assert block_to_rows(block) == [b"abc", None, b""]


def test_rows_in_accepts_pandas_cells():
    from pyspark.ml.linalg import DenseVector

    block = rows_in([DenseVector([1.0, 2.0]), None, float("nan"), np.array([3.0, 4.0])], "v")
    assert isinstance(block, Tensor) and block.valid.tolist() == [True, False, False, True]
    assert rows_in(["a", None], "s").tolist() == ["a", None]


def test_rows_in_names_the_column_and_both_shapes_of_a_ragged_tensor_column():
    with pytest.raises(ValueError, match=r"column 'v': rows have different shapes \(\[2\] and \[3\]\)"):
        rows_in([np.ones(3), np.ones(2)], "v")


def test_stack_rows_keeps_ragged_rows_as_a_list():
    assert isinstance(stack_rows([np.ones(2), None]), Tensor)
    ragged = stack_rows([np.ones(2), np.ones(3)])
    assert isinstance(ragged, list)
    assert to_arrow(ragged, pa.list_(pa.float32())).to_pylist() == [[1.0, 1.0], [1.0, 1.0, 1.0]]


def test_bounded_slices_keep_each_result_under_the_cap():
    row_bytes = 1000
    seen = []

    def run(start, stop):
        seen.append(stop - start)
        return pa.array(np.zeros((stop - start) * row_bytes // 8))

    results = list(bounded_slices(1000, run, max_bytes=50_000, first=10))
    assert sum(seen) == 1000 and seen[0] == 10
    assert max(r.nbytes for r in results) <= 50_000 and len(results) >= 20
