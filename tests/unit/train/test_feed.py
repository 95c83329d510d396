"""Image rows decoded and augmented in worker processes (irbis.kernels.feed): the same batches as on the task's
threads, in order, a bounded number ahead, errors named, and the rule for how many processes."""
import time

import numpy as np
import pyarrow as pa
import pytest

from irbis.kernels.feed import feed, feed_processes
from irbis.train.rows import BatchPlan
from irbis.train.stream import FEATURES, LABEL, InputFormat, read_partition


def test_auto_starts_no_process_on_a_cpu_and_all_but_one_cpu_on_a_gpu():
    assert feed_processes("auto", "cpu", cpus=8) == 0
    assert feed_processes("auto", "cuda:1", cpus=8) == 7
    assert feed_processes("auto", "cuda:0", cpus=1) == 0
    assert feed_processes("3", "cpu", cpus=2) == 3
    with pytest.raises(ValueError, match="feedProcesses must be 'auto' or a count"):
        feed_processes("many", "cpu", cpus=2)


def test_the_param_refuses_a_value_that_is_no_count():
    from irbis.errors import ParamValueError
    from irbis.ml import ImageClassifier, TorchEstimator

    assert TorchEstimator().getFeedProcesses() == "auto"
    assert ImageClassifier(feedProcesses="2").getFeedProcesses() == "2"
    with pytest.raises(ParamValueError, match="feedProcesses"):
        TorchEstimator(feedProcesses="-1")


def _slow_square(x: int) -> int:
    time.sleep(0.02 * (x % 3))  # later jobs may finish first
    return x * x


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("row 3 cannot be read")
    return x


def test_results_come_in_the_order_of_the_jobs_and_errors_reach_the_consumer():
    pool = feed(2)
    assert list(pool.map(_slow_square, range(12))) == [x * x for x in range(12)]
    assert feed(2) is pool  # one pool per size, kept for the next epoch
    with pytest.raises(ValueError, match="row 3 cannot be read"):
        list(pool.map(_fails_on_three, range(6)))
    assert list(pool.map(_slow_square, [4, 5])) == [16, 25]  # the pool outlives a failed job


def test_no_more_jobs_than_its_depth_are_taken_ahead_of_the_consumer():
    taken = []

    def jobs():
        for x in range(20):
            taken.append(x)
            yield x

    pool = feed(2)  # the process's pool of two: four jobs in flight at most
    results = pool.map(_slow_square, jobs())
    assert next(results) == 0
    assert pool.depth == 4 and len(taken) <= pool.depth + 1  # those in flight, and the one the consumer holds
    results.close()


def _image_shard(n=24):
    import cv2

    from irbis.kernels.image.augment import parse_augmentation
    from irbis.models import preprocessing_for

    rng = np.random.default_rng(0)
    jpegs = [cv2.imencode(".jpg", rng.integers(0, 255, (48 + i, 40 + 2 * i, 3), np.uint8))[1].tobytes()
             for i in range(n)]
    batch = pa.RecordBatch.from_arrays([pa.array(jpegs, pa.binary()), pa.array(np.arange(n) % 2, pa.float64())],
                                       [FEATURES, LABEL])
    augmentation = parse_augmentation('[{"op": "random_resized_crop", "scale": [0.5, 1.0]}, '
                                      '{"op": "flip", "flip_code": 1, "p": 0.5}]')
    fmt = InputFormat("encoded", [3, 32, 32], preprocessing=preprocessing_for("small_cnn_cifar").to_dict(),
                      augmentation=augmentation)
    shard, _ = read_partition(iter([batch]), fmt, 100)
    return shard


def test_batches_made_in_worker_processes_equal_those_made_on_threads():
    shard = _image_shard()
    rows, _, _ = shard.split(0.0, 0, "error")
    try:
        for epoch in (0, 1):
            plan = BatchPlan(5, 5, 7, 0, epoch)
            threads = [(xb.numpy(), yb.numpy()) for xb, yb in rows.batches(plan)]
            fed = [(xb.numpy(), yb.numpy()) for xb, yb in rows.batches(BatchPlan(5, 5, 7, 0, epoch,
                                                                                 feed_processes=2))]
            assert len(fed) == len(threads) == 5
            for (x1, y1), (x2, y2) in zip(threads, fed):
                assert x1.shape == (5, 3, 32, 32) and np.array_equal(x1, x2) and np.array_equal(y1, y2)
        plain = BatchPlan(5, 5, 7, 0, 0)
        drawn = np.concatenate([xb.numpy() for xb, _ in rows.batches(plain)])
        unaugmented = np.concatenate([xb.numpy() for xb, _ in rows.batches(plain, augment=False)])
        assert not np.array_equal(drawn, unaugmented)  # the augmentation ran in the processes too
        first = [xb.numpy() for xb, _ in rows.batches(plain)]
        resumed = [xb.numpy() for xb, _ in rows.batches(BatchPlan(5, 5, 7, 0, 0, start=3, feed_processes=2))]
        assert len(resumed) == 2 and all(np.array_equal(a, b) for a, b in zip(resumed, first[3:]))
    finally:
        shard.close()
