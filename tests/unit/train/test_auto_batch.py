"""batchSize="auto": the search keeps large batches where they are harmless and small ones where they hurt,
reproduces under one seed, resumes, and is refused where it cannot apply (thread backend, then the estimator)."""

import io

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from irbis.errors import ParamValueError
from irbis.train import checkpoint as ckpt
from irbis.train.auto_batch import SAMPLE_BYTES, AutoBatch, chosen, max_rows_in_memory, sample_size
from irbis.train.backends.local import run_threads, shard_rows
from irbis.train.loop import TrainSpec
from irbis.train.networks import network_spec
from train_helpers import CrashOnce


def separable(n=1024, seed=0):
    """Two Gaussian blobs 8 standard deviations apart in 16 dimensions: any batch sees both classes clearly."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 16)).astype(np.float32) + (8.0 * y[:, None] - 4.0) / 4.0
    return x.astype(np.float32), y


def linear_spec(**kw):
    base = dict(network=network_spec("mlp", {"in_features": 16, "hidden": [], "out_features": 2}),
                epochs=2, batchSize=8, optimizer="sgd", learningRate=0.05, lrScaling="linear",
                auto_batch=AutoBatch((8, 16, 32, 64), sample_rows=512))
    return TrainSpec.of(**{**base, **kw})


def weights(results):
    return torch.load(io.BytesIO(results[0].state), weights_only=True)


def test_the_rule_keeps_the_largest_size_that_keeps_up_and_stops_at_the_first_that_does_not():
    assert chosen({8: 1.0, 16: 1.02, 32: 1.05, 64: 1.5}, 2.0, 0.1) == 32  # 32 keeps 95% of the progress
    assert chosen({8: 1.0, 16: 1.2, 32: 1.0}, 2.0, 0.1) == 8  # 16 fails: 32 is not reached
    assert chosen({8: 1.0, 16: float("nan")}, 2.0, 0.5) == 8
    assert chosen({8: 2.1, 16: 2.1, 32: 2.2}, 2.0, 0.1) == 16  # no progress: a size must match the smallest
    with pytest.raises(ValueError, match="autoBatchTolerance"):
        AutoBatch(tolerance=1.0)


def test_auto_picks_a_large_batch_where_large_batches_are_harmless():
    x, y = separable()
    res = run_threads(linear_spec(), shard_rows(x, y, 2))
    record = res[0].history[0]
    assert record["batchSize"] > 8, record["batchTrials"]
    assert set(record["batchTrials"]) >= {"start", "8", "16"}
    assert record["trialSamples"] > 0
    assert res[1].history == res[0].history  # every worker decided alike


def test_auto_keeps_the_small_batch_where_large_batches_hurt():
    """The rate is tuned near the edge of stability for the smallest update (plain SGD at 0.3 on the digits
    MLP): under linear scaling the next size steps at twice that rate, past the edge, and on the judged rows
    its loss falls far less than the smallest size's. The search must keep the smallest size, and stop
    there without trying the larger ones."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    spec = TrainSpec.of(network=network_spec("mlp", {"in_features": 64, "hidden": 32, "out_features": 10}),
                        epochs=1, batchSize=16, optimizer="sgd", learningRate=0.3, lrScaling="linear",
                        auto_batch=AutoBatch((16, 32, 64), sample_rows=512))
    record = run_threads(spec, shard_rows(x, y, 2))[0].history[0]
    trials = record["batchTrials"]
    assert record["batchSize"] == 16, trials
    gain16, gain32 = trials["start"] - trials["16"], trials["start"] - trials["32"]
    assert gain16 > 0.3 * trials["start"] and gain32 < 0.75 * gain16
    assert "64" not in trials


def test_one_seed_reproduces_the_sizes_and_the_weights():
    x, y = separable()
    a = run_threads(linear_spec(seed=3), shard_rows(x, y, 2))
    b = run_threads(linear_spec(seed=3), shard_rows(x, y, 2))
    assert [h["batchSize"] for h in a[0].history] == [h["batchSize"] for h in b[0].history]
    assert [h["batchTrials"] for h in a[0].history] == [h["batchTrials"] for h in b[0].history]
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_crash_mid_epoch_resumes_at_the_size_the_search_chose(tmp_path):
    x, y = separable()
    crash_once = CrashOnce(at=9)

    kw = dict(augment=crash_once, prefetch=True, epochs=3)
    ref = run_threads(linear_spec(**kw), shard_rows(x, y, 2))
    assert ref[0].history[0]["batchSize"] > 8
    crash_once.arm()
    with pytest.raises(RuntimeError, match="injected"):
        run_threads(linear_spec(checkpointDir=str(tmp_path), checkpointInterval=2, **kw), shard_rows(x, y, 2))
    assert ckpt.latest(str(tmp_path)) is not None
    res = run_threads(linear_spec(checkpointDir=str(tmp_path), checkpointInterval=2, **kw), shard_rows(x, y, 2))
    assert res[0].resumed_from is not None
    got, want = weights(res), weights(ref)
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    assert [h["batchSize"] for h in res[0].history] == [h["batchSize"] for h in ref[0].history]


def test_the_sample_grows_on_large_data_until_the_largest_candidate_can_take_its_steps():
    auto = AutoBatch((16, 32, 64, 128, 256), sample_rows=512, min_steps=8)
    assert sample_size(auto, 256, 5_000) == 512  # small data: the sample as set
    assert sample_size(auto, 256, 30_000) == 1_500  # 5% of the rows
    assert sample_size(auto, 256, 1_000_000) == 8 * 256  # enough for 8 steps of 256, no more
    assert sample_size(auto, 3 * 224 * 224 * 4, 1_000_000) == SAMPLE_BYTES // (3 * 224 * 224 * 4)  # images: bytes
    assert sample_size(auto, 256, 300) == 300


def test_the_memory_bound_grows_with_the_free_memory_over_the_activations():
    net = torch.nn.Sequential(torch.nn.Linear(16, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2))
    bound = max_rows_in_memory(net, torch.zeros(2, 16), "cpu")
    assert bound is not None and bound >= 1
    wider = torch.nn.Sequential(torch.nn.Linear(16, 8 * 4096), torch.nn.ReLU(), torch.nn.Linear(8 * 4096, 2))
    assert max_rows_in_memory(wider, torch.zeros(2, 16), "cpu") < bound


def test_the_estimator_refuses_auto_under_a_parameter_server_and_a_tolerance_outside_0_1():
    from irbis.ml import TorchEstimator

    est = TorchEstimator(network="mlp", networkOptions='{"in_features": 4, "hidden": 4, "out_features": 2}',
                         batchSize="auto", strategy="downpour")
    with pytest.raises(ParamValueError, match="batchSize.*staleness"):
        est._spec()
    spec, _ = est.setStrategy("sync")._spec()
    assert spec.schedule.auto_batch is not None and spec.schedule.batchSize == spec.schedule.auto_batch.smallest
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ParamValueError, match="autoBatchTolerance"):
            est.setAutoBatchTolerance(bad)
    with pytest.raises(ParamValueError, match="batchSize"):
        est.setBatchSize("big")
    with pytest.raises(ParamValueError, match="autoBatchSizes"):
        est.setAutoBatchSizes("[0, 16]")
    with pytest.raises(ParamValueError, match="warmupEpochs"):
        TorchEstimator(network="mlp", epochs=2, warmupEpochs=2, lrScaling="linear")._spec()


def test_a_spilled_shard_searches_the_same_sample_read_a_batch_at_a_time():
    """A worker's rows past its buffer are spilled and read back a batch at a time (images always are): the
    search then reads its sample the same way instead of holding it, and sees the same rows as in memory,
    so the first search, from the same initial weights, finds the same losses and the same size."""
    import pyarrow as pa

    from irbis.train.stream import FEATURES, LABEL, InputFormat, SpilledShard, read_partition

    x, y = separable(n=1024)
    dense = shard_rows(x, y, 2)

    def spill(shard):
        batches = [pa.RecordBatch.from_arrays([pa.array(list(shard.x[s:s + 100])),
                                               pa.array(shard.y[s:s + 100].astype(np.float64))], [FEATURES, LABEL])
                   for s in range(0, len(shard.y), 100)]
        out, _ = read_partition(iter(batches), InputFormat("vector", [16]), 64)
        assert isinstance(out, SpilledShard)
        return out

    spilled = [spill(s) for s in dense]
    try:
        spec = linear_spec(epochs=1)
        want = run_threads(spec, dense)[0].history[0]
        got = run_threads(spec, spilled)[0].history[0]
    finally:
        for s in spilled:
            s.close()
    assert got["batchSize"] == want["batchSize"] > 8
    assert got["batchTrials"].keys() == want["batchTrials"].keys()
    assert all(got["batchTrials"][k] == pytest.approx(want["batchTrials"][k], rel=1e-5) for k in want["batchTrials"])
