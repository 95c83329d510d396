"""Streaming a worker's rows: spilled once, reshuffled every epoch, every row once per pass, bounded memory."""
import json
import os
import textwrap

import numpy as np
import pyarrow as pa

from irbis.train.rows import BatchPlan
from irbis.train.stream import FEATURES, LABEL, InputFormat, SpilledShard, read_partition
from irbis.train.worker_data import Shard
from train_helpers import peak_rss_mib


def batches(n, d=4, per=37, start=0):
    for s in range(start, start + n, per):
        m = min(per, start + n - s)
        x = np.arange(s, s + m, dtype=np.float32)[:, None].repeat(d, 1)
        yield pa.RecordBatch.from_arrays([pa.array(list(x)), pa.array(np.arange(s, s + m) % 3, pa.float64())],
                                         [FEATURES, LABEL])


def spilled(n, buffer_rows=100):
    shard, profile = read_partition(batches(n), InputFormat("vector", [4]), buffer_rows)
    assert isinstance(shard, SpilledShard)
    return shard, profile


def test_a_share_within_the_buffer_stays_a_dense_shard_and_a_larger_one_spills():
    small, _ = read_partition(batches(90), InputFormat("vector", [4]), 100)
    assert isinstance(small, Shard) and small.x.shape == (90, 4) and small.x[5, 0] == 5
    big, profile = spilled(1000)
    assert len(big) == 1000 and profile[0] == 1000 and len(big.spill.sizes) == 4
    big.close()
    assert not os.path.exists(big.spill.dir)


def test_every_row_once_per_epoch_in_an_order_that_changes_between_epochs():
    shard, _ = spilled(1000)
    rows, _, _ = shard.split(0.0, 0, "error")
    seen = {}
    for epoch in (0, 1):
        got = [xb[:, 0].numpy().astype(int) for xb, _ in rows.batches(BatchPlan(50, 20, 0, 0, epoch))]
        order = np.concatenate(got)
        assert sorted(order.tolist()) == list(range(1000))  # 20 x 50 rows: each row once
        seen[epoch] = order
        labels = np.concatenate([yb.numpy() for _, yb in rows.batches(BatchPlan(50, 20, 0, 0, epoch))])
        assert np.array_equal(labels, order % 3)  # labels travel with their rows
    assert not np.array_equal(seen[0], seen[1])
    # a window holds about buffer_rows rows: the first 100 rows of an epoch come from few blocks
    assert len(np.unique(seen[0][:100] // 256)) <= 2
    again = np.concatenate([xb[:, 0].numpy() for xb, _ in rows.batches(BatchPlan(50, 20, 0, 0, 0))])
    assert np.array_equal(again, seen[0])  # the seed fixes the order
    shard.close()


def test_steps_past_the_rows_draw_from_the_next_pass_and_resume_skips_what_was_done():
    shard, _ = spilled(300)
    rows, _, _ = shard.split(0.0, 0, "error")
    full = [xb[:, 0].numpy() for xb, _ in rows.batches(BatchPlan(64, 6, 1, 0, 0))]
    assert len(full) == 6 and all(len(b) == 64 for b in full)
    first_pass = np.concatenate(full)[:300]
    assert sorted(first_pass.astype(int).tolist()) == list(range(300))
    resumed = [xb[:, 0].numpy() for xb, _ in rows.batches(BatchPlan(64, 6, 1, 0, 0, start=4))]
    assert len(resumed) == 2 and all(np.array_equal(a, b) for a, b in zip(resumed, full[4:]))
    shard.close()


def test_validation_split_and_skipped_rows():
    def with_nan():
        for b in batches(500):
            x = np.stack(b.column(FEATURES).to_numpy(zero_copy_only=False))
            x[x[:, 0] % 50 == 7] = np.nan
            yield pa.RecordBatch.from_arrays([pa.array(list(x)), b.column(LABEL)], [FEATURES, LABEL])

    shard, profile = read_partition(with_nan(), InputFormat("vector", [4]), 100)
    assert profile[8] == 10  # the non-finite rows are profiled
    train, val, skipped = shard.split(0.2, 3, "skip")
    assert skipped == 10 and len(train) + len(val) == 490 and len(val) == 98
    assert not set(train.ids) & set(val.ids)
    xs = np.concatenate([xb.numpy() for xb, _ in val.in_order(64, "cpu", np.int64)])
    assert np.isfinite(xs).all() and len(xs) == 98
    shard.close()


def test_a_worker_peak_memory_does_not_grow_with_its_share():
    """Peak RSS of a worker reading and training-iterating 40 MB and 320 MB of rows, with a 2,000-row buffer."""
    script = textwrap.dedent("""
        import resource, sys, numpy as np, pyarrow as pa
        from irbis.train.rows import BatchPlan
        from irbis.train.stream import FEATURES, LABEL, InputFormat, read_partition
        rows, d = int(sys.argv[1]), 1000
        def gen():
            for s in range(0, rows, 500):
                x = np.random.default_rng(s).random((500, d), dtype=np.float32)
                yield pa.RecordBatch.from_arrays([pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), d)
                                                  .cast(pa.list_(pa.float32())),
                                                  pa.array(np.zeros(500))], [FEATURES, LABEL])
        shard, _ = read_partition(gen(), InputFormat("vector", [d]), 2000)
        train, _, _ = shard.split(0.0, 0, "error")
        seen = 0
        for epoch in range(2):
            for xb, yb in train.batches(BatchPlan(100, rows // 100, 0, 0, epoch)):
                seen += len(xb)
        shard.close()
        print(seen, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    peaks = peak_rss_mib(script, (10_000, 80_000))
    print("peak RSS MiB:", json.dumps(peaks))
    assert peaks[80_000] < 1.25 * peaks[10_000] + 32, peaks


def test_a_null_image_is_a_bad_image_that_skip_leaves_out_and_counts():
    """read_images gives a null image (and a reason) for a file it could not decode: the profile counts it
    with the images that cannot be read, not as a null feature row, and nanPolicy='skip' leaves it out."""
    import cv2

    from irbis.models import preprocessing_for
    from irbis.train.checks import PROFILE_KEYS, merge_profiles

    png = cv2.imencode(".png", np.full((40, 40, 3), 200, np.uint8))[1].tobytes()
    images = pa.array([png, None, png, png], pa.binary())
    batch = pa.RecordBatch.from_arrays([images, pa.array([0.0, 1.0, 1.0, 0.0])], [FEATURES, LABEL])
    fmt = InputFormat("encoded", [3, 32, 32], preprocessing=preprocessing_for("small_cnn_cifar").to_dict())
    shard, profile = read_partition(iter([batch]), fmt, 100)
    merged = merge_profiles([profile])
    assert dict(zip(PROFILE_KEYS, profile))["null_features"] == 0
    assert merged["bad_images"] == 1 and merged["first_bad_row"] == 1
    train, _, skipped = shard.split(0.0, 0, "skip")
    assert skipped == 1 and sorted(train.ids.tolist()) == [0, 2, 3]
    xs = np.concatenate([xb.numpy() for xb, _ in train.in_order(8, "cpu", np.int64)])
    assert xs.shape == (3, 3, 32, 32) and np.allclose(xs, xs[0])  # three copies of the same picture
    shard.close()
