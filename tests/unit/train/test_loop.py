"""The training loop on the thread backend: learning, checkpoints and exact resume."""

import io
import threading

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from irbis.train import checkpoint as ckpt
from irbis.train.backends.local import run_threads, shard_rows
from irbis.train.loop import TrainSpec
from irbis.train.networks import network_spec
from irbis.train.worker_data import Shard, batch_rng, epoch_batches, iterate, split_validation


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return (x[:400] / 16).astype(np.float32), y[:400]


def spec(**kw):
    base = dict(network=network_spec("mlp", {"in_features": 64, "hidden": 32, "out_features": 10}),
                epochs=4, batchSize=16, optimizer="momentum", learningRate=0.05)
    return TrainSpec.of(**{**base, **kw})


def final_weights(results):
    return torch.load(io.BytesIO(results[0].state), weights_only=True)


def same(a, b):
    return all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_epoch_batches_equal_steps_for_unequal_shards():
    a = epoch_batches(50, 16, steps=4, seed=0, rank=0, epoch=0)
    b = epoch_batches(40, 16, steps=4, seed=0, rank=1, epoch=0)
    assert len(a) == len(b) == 4
    assert sorted(np.concatenate(a)[:50].tolist()) == list(range(50))  # every row once, then the padding
    assert set(np.concatenate(b).tolist()) == set(range(40))
    assert not np.array_equal(np.concatenate(a), np.concatenate(epoch_batches(50, 16, 4, 0, 0, 1)))


def test_epoch_batches_are_full_so_no_step_averages_a_few_rows():
    # 50 rows in 4 batches of 16: the last batch tops its 2 rows up with 14 drawn again
    assert [len(b) for b in epoch_batches(50, 16, steps=4, seed=0, rank=0, epoch=0)] == [16] * 4
    # every worker's rows fit in one batch: the batch is the shard, not padded with repeats
    assert sorted(epoch_batches(5, 16, steps=1, seed=0, rank=0, epoch=0)[0].tolist()) == list(range(5))


def test_split_validation_is_seeded_and_disjoint():
    s = Shard(np.arange(20, dtype=np.float32)[:, None], np.arange(20))
    tr, va = split_validation(s, 0.25, seed=3)
    tr2, _ = split_validation(s, 0.25, seed=3)
    assert len(va) == 5 and set(tr.y) | set(va.y) == set(range(20)) and np.array_equal(tr.y, tr2.y)


@pytest.mark.parametrize("prefetch", [False, True])
def test_iterate_from_a_later_batch_draws_the_augmentation_of_the_full_pass(prefetch):
    x, y = torch.arange(40, dtype=torch.float32).view(20, 2), torch.arange(20)
    batches = epoch_batches(20, 4, steps=5, seed=0, rank=0, epoch=0)

    def noise(batch, rng):
        return batch + rng.normal(size=batch.shape)

    def run(start):
        return [xb for xb, _ in iterate(x, y, batches, noise, lambda i: batch_rng(0, 0, 0, i), prefetch, start)]

    full, tail = run(0), run(3)
    assert len(tail) == 2 and all(torch.equal(a, b) for a, b in zip(full[3:], tail))
    assert not torch.equal(full[3], x.index_select(0, torch.from_numpy(batches[3])))


def test_two_workers_learn_and_report_summary(digits):
    x, y = digits
    res = run_threads(spec(validationFraction=0.2, epochs=6), shard_rows(x, y, 2))
    hist = res[0].history
    assert [h["epoch"] for h in hist] == list(range(1, 7))
    assert hist[-1]["loss"] < hist[0]["loss"] and hist[-1]["accuracy"] > 0.8
    assert hist[-1]["bytesPerStep"] == sum(p.numel() for p in final_weights(res).values()) * 4


def test_resume_from_epoch_checkpoint_equals_uninterrupted(digits, tmp_path):
    x, y = digits
    ref = final_weights(run_threads(spec(), shard_rows(x, y, 2)))
    run_threads(spec(epochs=2, checkpointDir=str(tmp_path)), shard_rows(x, y, 2))
    res = run_threads(spec(checkpointDir=str(tmp_path)), shard_rows(x, y, 2))
    assert res[0].resumed_from is not None and len(res[0].history) == 4
    assert same(final_weights(res), ref)


@pytest.mark.parametrize("strategy", ["sync", "one_bit", "block_momentum"])
def test_crash_mid_epoch_resumes_exactly(digits, tmp_path, strategy):
    x, y = digits
    calls, armed, lock = [0], [False], threading.Lock()

    def crash_once(batch, rng):
        with lock:
            calls[0] += 1
            if armed[0] and calls[0] == 25:
                armed[0] = False
                raise RuntimeError("injected failure")
        return batch + rng.normal(0.0, 0.05, batch.shape)  # the resumed run must draw the same noise

    kw = dict(strategy=strategy, augment=crash_once, prefetch=True, epochs=3)
    ref = final_weights(run_threads(spec(**kw), shard_rows(x, y, 2)))
    calls[0], armed[0] = 0, True
    with pytest.raises(RuntimeError, match="injected"):
        run_threads(spec(checkpointDir=str(tmp_path), checkpointInterval=5, **kw), shard_rows(x, y, 2))
    # the crash lands near step 10; whether that checkpoint was committed first depends on thread timing
    committed = ckpt.latest(str(tmp_path))["step"]
    assert committed in (5, 10)
    res = run_threads(spec(checkpointDir=str(tmp_path), checkpointInterval=5, **kw), shard_rows(x, y, 2))
    assert res[0].resumed_from == committed
    assert same(final_weights(res), ref)


def test_checkpoint_from_other_world_size_is_refused(digits, tmp_path):
    x, y = digits
    run_threads(spec(epochs=1, checkpointDir=str(tmp_path)), shard_rows(x, y, 2))
    with pytest.raises(ValueError, match="written by 2 workers"):
        run_threads(spec(epochs=2, checkpointDir=str(tmp_path)), shard_rows(x, y, 1))


# -- training never fails silently ----------------------------------------------------------------
def test_non_finite_loss_stops_every_rank_naming_epoch_step_and_rows(digits):
    from irbis.errors import NonFiniteLossError

    x, y = digits
    x = x.copy()
    x[5, 3] = np.nan
    with pytest.raises(NonFiniteLossError) as info:
        run_threads(spec(epochs=3, seed=1), shard_rows(x, y, 2))
    err = info.value
    assert err.fields["epoch"] == 1 and err.fields["nonFiniteRows"] == 1
    assert 1 <= err.fields["step"] <= -(-200 // 16)
    assert f"epoch 1, step {err.fields['step']} of 13" in str(err) and "nanPolicy='skip'" in str(err)


def test_nan_policy_skip_drops_and_counts_the_rows(digits):
    x, y = digits
    x, y = x.copy(), y.astype(np.float64)
    x[[5, 7], 3], y[300] = np.inf, np.nan
    hist = run_threads(spec(epochs=2, nanPolicy="skip"), shard_rows(x, y, 2))[0].history
    assert [h["skippedRows"] for h in hist] == [3, 3]
    assert all(np.isfinite(h["loss"]) for h in hist) and hist[-1]["loss"] < hist[0]["loss"]
    assert all("warning" not in h for h in hist)


def test_a_loss_growing_by_orders_of_magnitude_warns_in_the_summary(digits):
    x, y = digits
    hist = run_threads(spec(epochs=1, optimizer="adam", learningRate=1e6), shard_rows(x, y, 2))[0].history
    assert "the loss grew from" in hist[0]["warning"] and "learning rate (1e+06)" in hist[0]["warning"]


@pytest.mark.parametrize("strategy", ["model_averaging", "sync"])
def test_batchnorm_statistics_follow_the_final_weights_after_model_averaging(digits, strategy):
    # the final model's running statistics are recomputed under its own weights (each worker over its
    # rows, then averaged), also where the replicas share their weights at every step (recomputeBatchNorm)
    from torch.optim.swa_utils import update_bn

    from irbis.models import build_model

    x, y = digits
    images = np.repeat(np.kron(x[:160].reshape(-1, 1, 8, 8), np.ones((1, 1, 4, 4), np.float32)), 3, axis=1)
    shards = shard_rows(images.reshape(160, -1), y[:160], 2)
    res = run_threads(spec(network=network_spec("small_cnn", {"width": 4}), inputShape=[3, 32, 32], epochs=1,
                           strategy=strategy, optimizer="sgd"), shards)
    state = final_weights(res)
    net = build_model("small_cnn", width=4)
    net.load_state_dict(state)
    expected = {}
    for rank, shard in enumerate(shards):  # every worker's statistics under the final weights, averaged
        with torch.no_grad():  # over shuffled full batches, as training draws them, a pass after the last
            update_bn([torch.from_numpy(shard.x[ids]).view(-1, 3, 32, 32)
                       for ids in epoch_batches(len(shard), 16, -(-len(shard) // 16), 0, rank, 1)], net)
        for k, v in net.state_dict().items():
            if "running_" in k:
                expected[k] = expected.get(k, 0) + v / len(shards)
    recomputed = all(torch.allclose(state[k], v, atol=1e-5) for k, v in expected.items())
    assert recomputed
