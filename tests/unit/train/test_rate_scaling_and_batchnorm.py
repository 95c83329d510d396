"""Learning-rate scaling with warm-up, and BatchNorm statistics recomputed after training (thread backend)."""

import io
import math

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from irbis.train import checkpoint as ckpt
from irbis.train.backends.local import run_threads, shard_rows
from irbis.train.loop import TrainSpec
from irbis.train.networks import network_spec
from irbis.train.optim import batch_scale, rate_factor, update_batch, warmup_factor
from irbis.train.strategies import DCASGD, BlockMomentum, Downpour, MixedSync, ModelAveraging, OneBitSGD, SyncSGD
from irbis.train.worker_data import epoch_batches
from train_helpers import CrashOnce


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return (x[:400] / 16).astype(np.float32), y[:400]


def spec(**kw):
    base = dict(network=network_spec("mlp", {"in_features": 64, "hidden": 32, "out_features": 10}),
                epochs=3, batchSize=16, optimizer="sgd", learningRate=0.05)
    return TrainSpec.of(**{**base, **kw})


def final_weights(results):
    return torch.load(io.BytesIO(results[0].state), weights_only=True)


# -- the rules ---------------------------------------------------------------------------------------------
def test_batch_scale_linear_sqrt_and_none():
    assert batch_scale("none", 256, 32) == 1.0
    assert batch_scale("linear", 256, 32) == 8.0
    assert batch_scale("sqrt", 256, 64) == 2.0
    assert batch_scale("linear", 16, 32) == 0.5
    with pytest.raises(ValueError, match="lrScaling must be one of"):
        batch_scale("cubic", 1, 1)


def test_warm_up_climbs_linearly_from_the_base_rate_to_the_scaled_one():
    assert warmup_factor(4.0, 0.0, 2.0) == 1.0
    assert warmup_factor(4.0, 1.0, 2.0) == 2.5
    assert warmup_factor(4.0, 2.0, 2.0) == warmup_factor(4.0, 7.0, 2.0) == 4.0
    assert warmup_factor(4.0, 1.0, 0.0) == 4.0  # no warm-up: the scaled rate from the first step
    assert warmup_factor(0.5, 0.0, 2.0) == 0.5  # a rate scaled down needs no warm-up
    step = {"type": "step", "stepSize": 1, "gamma": 0.5}
    assert rate_factor(1, 1.5, step, 4, scale=3.0, warmup_epochs=3.0) == pytest.approx(0.5 * 2.0)
    assert rate_factor(2, 2.0, {"type": "cosine"}, 4) == pytest.approx(0.5)


@pytest.mark.parametrize(("strategy", "workers", "rows"), [
    (SyncSGD(), 4, 64), (SyncSGD(backupWorkers=1), 4, 48), (SyncSGD(backupWorkers=1), 1, 16), (OneBitSGD(), 2, 32),
    (ModelAveraging(), 4, 64),
    (BlockMomentum(), 4, 16),  # the filter's gain ζ / (1 - η) = N already scales the step by N
    (BlockMomentum(blockMomentum=0.0), 4, 64), (BlockMomentum(blockMomentum=0.5, blockLearningRate=2.0), 4, 16),
    (Downpour(), 4, 16), (DCASGD(), 8, 16), (MixedSync(groupSize=2), 4, 32)])
def test_the_batch_one_update_averages(strategy, workers, rows):
    assert update_batch(strategy, 16, workers) == rows


# -- in the loop -------------------------------------------------------------------------------------------
class RecordingSGD(torch.optim.SGD):
    """SGD that records the rate of every step (one list per worker)."""

    made: list = []

    def __init__(self, params):
        super().__init__(params, lr=0.05)
        self.rates = []
        RecordingSGD.made.append(self)

    def step(self, closure=None):
        self.rates.append(self.param_groups[0]["lr"])
        return super().step(closure)


def test_linear_scaling_warms_up_step_by_step_then_follows_the_schedule(digits):
    x, y = digits  # 2 workers x 200 rows, batch 16: 13 steps an epoch
    RecordingSGD.made = []
    schedule = {"type": "step", "stepSize": 2, "gamma": 0.5}
    run_threads(spec(optimizer=RecordingSGD, lrScaling="linear", warmupEpochs=1.5, learningRateSchedule=schedule),
                shard_rows(x, y, 2))
    steps = 13
    expected = [0.05 * (0.5 ** (k // steps // 2)) * (1 + min(1.0, k / steps / 1.5)) for k in range(3 * steps)]
    for opt in RecordingSGD.made:
        np.testing.assert_allclose(opt.rates, expected, rtol=1e-12)


def test_scaled_rate_equals_the_rate_set_by_hand(digits):
    x, y = digits  # sqrt: 2 workers x batch 16 over a reference of 8 is a factor 2
    scaled = run_threads(spec(lrScaling="sqrt", referenceBatchSize=8), shard_rows(x, y, 2))
    by_hand = run_threads(spec(learningRate=0.1), shard_rows(x, y, 2))
    a, b = final_weights(scaled), final_weights(by_hand)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_crash_during_warm_up_resumes_exactly(digits, tmp_path):
    x, y = digits
    crash_once = CrashOnce(at=25)

    kw = dict(augment=crash_once, prefetch=True, lrScaling="linear", warmupEpochs=2.0)
    ref = final_weights(run_threads(spec(**kw), shard_rows(x, y, 2)))
    crash_once.arm()
    with pytest.raises(RuntimeError, match="injected"):
        run_threads(spec(checkpointDir=str(tmp_path), checkpointInterval=5, **kw), shard_rows(x, y, 2))
    assert ckpt.latest(str(tmp_path))["step"] in (5, 10)  # mid-epoch, mid-warm-up
    res = run_threads(spec(checkpointDir=str(tmp_path), checkpointInterval=5, **kw), shard_rows(x, y, 2))
    assert res[0].resumed_from is not None
    got = final_weights(res)
    assert all(torch.allclose(got[k], ref[k], atol=1e-6) for k in ref)


def test_parameter_server_workers_send_the_scaled_rate(digits):
    x, y = digits  # one worker's batch per update: linear scaling over a reference of 4 is a factor 4
    scaled = run_threads(spec(strategy="downpour", strategyOptions={"serverOptimizer": "sgd"}, lrScaling="linear",
                              referenceBatchSize=4), shard_rows(x, y, 2))
    by_hand = run_threads(spec(strategy="downpour", strategyOptions={"serverOptimizer": "sgd"}, learningRate=0.2),
                          shard_rows(x, y, 2))
    a, b = final_weights(scaled), final_weights(by_hand)
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- BatchNorm statistics ----------------------------------------------------------------------------------
def upscaled(x, side=32):
    """Digits as 3-channel ``side`` x ``side`` images, flattened."""
    k = side // 8
    return np.repeat(np.kron(x.reshape(-1, 1, 8, 8), np.ones((1, 1, k, k), np.float32)), 3, axis=1).reshape(len(x), -1)


def expected_statistics(state, shards, size=16, seed=0, epochs=1):
    """What every worker's ``update_bn`` gives under the final weights, over the shuffled full batches of a
    pass after the last epoch, averaged over the workers."""
    from torch.optim.swa_utils import update_bn

    from irbis.models import build_model

    net = build_model("small_cnn", width=4)
    net.load_state_dict(state)
    expected = {}
    for rank, shard in enumerate(shards):
        batches = epoch_batches(len(shard), size, -(-len(shard) // size), seed, rank, epochs)
        with torch.no_grad():
            update_bn([torch.from_numpy(shard.x[ids]).view(-1, 3, 32, 32) for ids in batches], net)
        for k, v in net.state_dict().items():
            if "running_" in k:
                expected[k] = expected.get(k, 0) + v / len(shards)
    return expected


@pytest.mark.parametrize(("strategy", "mode", "recomputed"), [
    ("sync", "always", True), ("sync", "auto", True), ("sync", "never", False), ("model_averaging", "never", False),
    ("downpour", "auto", True)])
def test_recompute_batchnorm_gives_update_bn_statistics(digits, strategy, mode, recomputed):
    x, y = digits
    shards = shard_rows(upscaled(x[:160]), y[:160], 2)
    res = run_threads(spec(network=network_spec("small_cnn", {"width": 4}), inputShape=[3, 32, 32], epochs=1,
                           strategy=strategy, recomputeBatchNorm=mode), shards)
    state = final_weights(res)
    expected = expected_statistics(state, shards)
    assert all(torch.allclose(state[k], v, atol=1e-5) for k, v in expected.items()) == recomputed


def frozen_stem_cnn():
    """small_cnn with its first conv and BatchNorm frozen (the BatchNorm held in eval mode)."""
    from irbis.models import build_model
    from irbis.train.finetune import freeze_until

    net = build_model("small_cnn", width=4)
    with torch.no_grad():
        net.features[1].running_mean.fill_(0.25)
        net.features[1].running_var.fill_(2.0)
    freeze_until(net, "features.1")
    return net


class Fixed(torch.nn.Module):
    """A BatchNorm layer's eval-mode transform, fixed: ``update_bn`` finds nothing to reset in it."""

    def __init__(self, bn):
        super().__init__()
        self.scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        self.shift = bn.bias - bn.running_mean * self.scale

    def forward(self, x):
        return x * self.scale[:, None, None] + self.shift[:, None, None]


def test_frozen_batchnorm_layers_keep_their_statistics_and_use_them_meanwhile(digits):
    from torch.optim.swa_utils import update_bn

    x, y = digits
    shards = shard_rows(upscaled(x[:64]), y[:64], 1)
    res = run_threads(spec(network=network_spec(frozen_stem_cnn), inputShape=[3, 32, 32], epochs=1,
                           recomputeBatchNorm="always"), shards)
    state = final_weights(res)
    assert torch.all(state["features.1.running_mean"] == 0.25) and torch.all(state["features.1.running_var"] == 2.0)
    net = frozen_stem_cnn()
    net.load_state_dict(state)
    with torch.no_grad():
        net.features[1] = Fixed(net.features[1])  # the later layers' statistics, gathered behind the frozen one
        update_bn([torch.from_numpy(shards[0].x[ids]).view(-1, 3, 32, 32)
                   for ids in epoch_batches(64, 16, 4, 0, 0, 1)], net)
    expected = net.state_dict()
    for k in ("features.5.running_mean", "features.5.running_var", "features.9.running_mean"):
        assert torch.allclose(state[k], expected[k], atol=1e-5), k


def test_one_worker_sync_small_cnn_tests_higher_with_statistics_recomputed():
    """At a constant rate the running averages lag the weights; under the final weights the test accuracy
    rises on every seed (digits upscaled to 3x32x32, the same trajectory with and without)."""
    from sklearn.model_selection import train_test_split

    from irbis.models import build_model

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(upscaled((x / 16).astype(np.float32)), y, test_size=0.2, stratify=y,
                                          random_state=0)
    accuracy = {}
    for seed in (0, 1, 2):
        for mode in ("never", "auto"):
            res = run_threads(TrainSpec.of(network=network_spec("small_cnn", {"width": 8}), epochs=3, batchSize=32,
                                           optimizer="adam", learningRate=3e-3, seed=seed, inputShape=[3, 32, 32],
                                           recomputeBatchNorm=mode), shard_rows(xtr, ytr, 1))
            net = build_model("small_cnn", width=8)
            net.load_state_dict(final_weights(res))
            with torch.no_grad():
                out = net(torch.from_numpy(xte).view(-1, 3, 32, 32))
            accuracy[seed, mode] = float((out.argmax(1).numpy() == yte).mean())
    for seed in (0, 1, 2):
        assert accuracy[seed, "auto"] >= accuracy[seed, "never"], accuracy
        assert accuracy[seed, "auto"] >= 0.9, accuracy
    assert math.fsum(accuracy[s, "auto"] - accuracy[s, "never"] for s in (0, 1, 2)) / 3 >= 0.03, accuracy


def batchnorm_head():
    return torch.nn.Sequential(torch.nn.BatchNorm1d(1), torch.nn.Linear(1, 2))


def test_recomputed_variance_spans_rows_grouped_by_class():
    """Rows in file order come grouped (here by class): batches drawn in that order would each see one group,
    and the mean of their variances would leave out the variance between the groups."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 0.1, 64), rng.normal(10, 0.1, 64)]).astype(np.float32)[:, None]
    y = np.repeat([0, 1], 64)
    res = run_threads(spec(network=network_spec(batchnorm_head), epochs=1, recomputeBatchNorm="always"),
                      shard_rows(x, y, 1))
    assert 20 < float(final_weights(res)["0.running_var"]) < 30  # the variance of all rows: 25
