"""Augmented images are decoded on the task's threads: the batch does not depend on how many, and a bad row is
named by its place in the batch."""
from __future__ import annotations

import cv2
import numpy as np
import pyarrow as pa
import pytest

from irbis.kernels import threads
from irbis.kernels.image.augment import parse_augmentation
from irbis.train.stream import InputFormat

PREP = {"input_size": [32, 32], "mean": [127.0] * 3, "std": [128.0] * 3}
AUGMENTATION = parse_augmentation([{"op": "random_resized_crop", "scale": [0.6, 1.0]},
                                   {"op": "flip", "flip_code": 1, "p": 0.5}])


def jpegs(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [cv2.imencode(".jpg", rng.integers(0, 256, (48, 40, 3), dtype=np.uint8))[1].tobytes() for _ in range(n)]


def decode(fmt: InputFormat, column: pa.Array, count: int) -> np.ndarray:
    rngs = [np.random.default_rng([3, i]) for i in range(len(column))]
    before = list(threads._THREADS)
    try:
        threads._THREADS[:] = [count]
        return fmt.decode(column, rngs)
    finally:
        threads._THREADS[:] = before


def test_augmented_decoding_is_the_same_on_one_thread_and_four():
    fmt = InputFormat("encoded", [3, 32, 32], preprocessing=PREP, augmentation=AUGMENTATION)
    column = pa.array(jpegs(12), pa.binary())
    one, four = decode(fmt, column, 1), decode(fmt, column, 4)
    assert one.shape == (12, 3, 32, 32) and np.array_equal(one, four)
    assert not np.array_equal(one[0], one[1])  # the rows are drawn, not copies


def test_a_bad_row_is_named_whatever_the_threads():
    fmt = InputFormat("encoded", [3, 32, 32], preprocessing=PREP, augmentation=AUGMENTATION)
    files = jpegs(8)
    files[5] = b"not a jpeg"
    with pytest.raises(ValueError, match="row 5 of the batch"):
        decode(fmt, pa.array(files, pa.binary()), 4)
