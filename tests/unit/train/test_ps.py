"""The parameter server: update rules, shards, the ZeroMQ transport, and the asynchronous strategies."""

import io

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from irbis.train.backends.local import run_processes, run_threads, shard_rows
from irbis.train.faults import Stragglers
from irbis.train.loop import TrainSpec
from irbis.train.networks import network_spec
from irbis.train.ps.rules import MIN_SHARD_WEIGHTS, SERVER_OPTIMIZERS, default_shards, delay_compensate, split_shards
from irbis.train.ps.shard import APPLIED, REJECTED, REPLAYED, ShardState
from irbis.train.ps.transport import PSClient, ShardServer
from irbis.train.strategies import make_strategy
from train_helpers import CrashOnce

SECRET = b"k" * 32


def test_split_shards_is_balanced_contiguous_and_refuses_more_shards_than_weights():
    ranges = split_shards([10, 3, 7], 3)
    assert ranges[0][0] == 0 and ranges[-1][1] == 20
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert max(h - lo for lo, h in ranges) - min(h - lo for lo, h in ranges) <= 1
    with pytest.raises(ValueError, match="numShards=21 is more than the model's 20 parameters"):
        split_shards([10, 3, 7], 21)


def test_default_shards_are_one_per_worker_but_none_below_the_minimum_size():
    assert default_shards(9_610, 4) == 1  # digits' MLP: one message per step, not four small ones
    assert default_shards(3 * MIN_SHARD_WEIGHTS, 8) == 3
    assert default_shards(25_000_000, 8) == 8
    assert default_shards(10, 1) == 1


def test_delay_compensation_formula_and_lambda_zero_is_identity():
    g, now, pulled = np.array([1.0, -2.0], np.float32), np.array([0.5, 0.5], np.float32), np.zeros(2, np.float32)
    assert delay_compensate(g, now, pulled, 0.0) is g
    np.testing.assert_allclose(delay_compensate(g, now, pulled, 0.1), g + 0.1 * g * g * (now - pulled))
    state = {}
    out = delay_compensate(g, now, pulled, 0.1, state)  # adaptive: λ / sqrt(mean square)
    ms = 0.05 * g * g
    np.testing.assert_allclose(out, g + 0.1 / np.sqrt(ms + 1e-8) * g * g * (now - pulled), rtol=1e-5)


@pytest.mark.parametrize("rule", sorted(SERVER_OPTIMIZERS))
def test_every_server_rule_descends_a_quadratic(rule):
    w, state = np.array([3.0, -2.0], np.float32), {}
    for _ in range(200):
        SERVER_OPTIMIZERS[rule](w, w.copy(), 0.3, state)  # gradient of |w|^2 / 2
    assert np.abs(w).max() < 0.1


def test_shard_counts_staleness_rejects_and_replays():
    shard = ShardState(np.zeros(4, np.float32), optimizer="sgd")
    g = np.ones(4, np.float32)
    assert shard.push(0, 1, 0, g, 0.1) == APPLIED
    assert shard.push(1, 1, 0, g, 0.1) == APPLIED  # computed at version 0, applied at 1: staleness 1
    assert shard.push(1, 1, 1, g, 0.1) == REPLAYED  # same sequence number again
    assert shard.push(0, 2, 5, g, 0.1) == REJECTED  # a version the shard never handed out
    assert shard.push(0, 3, 2, np.ones(3, np.float32), 0.1) == REJECTED  # wrong shape
    assert shard.counts == {"applied": 2, "rejected": 2, "replayed": 1}
    assert shard.staleness[:2].tolist() == [1, 1] and shard.version == 2
    np.testing.assert_allclose(shard.weights, -0.2)


@pytest.fixture
def server():
    srv = ShardServer({0: ShardState(np.zeros(3, np.float32), optimizer="sgd"),
                       1: ShardState(np.ones(2, np.float32), optimizer="sgd")}, SECRET)
    yield srv
    srv.close()


def test_transport_pushes_and_pulls_raw_buffers(server):
    client = PSClient([server.address] * 2, [(0, 3), (3, 5)], SECRET, worker=0)
    try:
        client.hello()
        w = np.empty(5, np.float32)
        client.pull(w)
        np.testing.assert_array_equal(w, [0, 0, 0, 1, 1])
        client.push(np.arange(5, dtype=np.float32), 0.5, pull_into=w)
        np.testing.assert_allclose(w, [0, -0.5, -1, -0.5, -1])
        assert client.versions == [1, 1]
        assert client.stats([0, 1])[:3].tolist() == [2, 0, 0]
    finally:
        client.close()


def test_transport_refuses_a_client_without_the_secret_and_counts_it(server):
    intruder = PSClient([server.address], [(0, 3)], b"x" * 32, worker=0)
    try:
        with pytest.raises(PermissionError, match="refused"):
            intruder.pull(np.empty(3, np.float32))
        with pytest.raises(PermissionError, match="refused"):
            intruder.push(np.ones(3, np.float32), 1.0)
    finally:
        intruder.close()
    assert server.refused == 2
    np.testing.assert_array_equal(server.shards[0].weights, 0)  # nothing applied


def test_an_unreachable_server_is_named_before_training():
    client = PSClient(["tcp://127.0.0.1:9"], [(0, 3)], SECRET, worker=0)
    try:
        with pytest.raises(ValueError, match=r"tcp://127.0.0.1:9 \(shard 0\) did not answer"):
            client.hello(timeout_s=0.3)
    finally:
        client.close()


@pytest.mark.parametrize("name, options, message", [
    ("mixed", {"groupSize": 0}, "groupSize must be an int >= 1, found 0"),
    ("dcasgd", {"lambda_": -0.1}, "lambda_ must be a number >= 0, found -0.1"),
    ("downpour", {"lambda_": 1.0}, "bad strategyOptions for 'downpour'.*lambda_"),
    ("downpour", {"serverOptimizer": "adam"}, "serverOptimizer must be one of"),
    ("downpour", {"placement": "remote"}, r"placement must be one of \['colocated', 'dedicated', 'driver'\]"),
    ("sync", {"placement": "dedicated"}, "bad strategyOptions for 'sync'.*placement"),  # no servers to place
])
def test_bad_options_fail_at_construction(name, options, message):
    with pytest.raises(ValueError, match=message):
        make_strategy(name, **options)


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return (x[:600] / 16).astype(np.float32), y[:600]


def spec(strategy, options=None, **kw):
    base = dict(network=network_spec("mlp", {"in_features": 64, "hidden": 32, "out_features": 10}), epochs=3,
                batchSize=16, optimizer="sgd", learningRate=0.1, strategy=strategy,
                strategyOptions=options or {}, validationFraction=0.2)
    return TrainSpec.of(**{**base, **kw})


def final(results):
    return torch.load(io.BytesIO(results[0].state), weights_only=True)


def test_bad_worker_counts_fail_before_training(digits):
    x, y = digits
    with pytest.raises(ValueError, match="groupSize=2 does not divide numWorkers=3"):
        run_threads(spec("mixed", {"groupSize": 2}), shard_rows(x, y, 3))
    with pytest.raises(ValueError, match="numShards=100000 is more than the model's 2410 parameters"):
        run_threads(spec("downpour", {"numShards": 100000}), shard_rows(x, y, 2))


def test_one_worker_sees_no_staleness(digits):
    x, y = digits
    hist = run_threads(spec("downpour", {"numShards": 3}), shard_rows(x, y, 1))[0].history
    assert all(h["staleness"]["max"] == 0 and h["psUpdates"]["rejected"] == 0 for h in hist)
    assert hist[-1]["psUpdates"]["applied"] == 3 * -(-480 // 16)  # every step's push, on each of 3 shards
    assert hist[-1]["bytesPerStep"] == 2410 * 4  # one float32 gradient pushed per step


def test_the_straggler_hook_slows_a_worker_without_changing_the_math(digits):
    x, y = digits
    plain = run_threads(spec("sync", epochs=1), shard_rows(x, y, 2))
    slowed = run_threads(spec("sync", epochs=1, step_hook=Stragglers({1: 1.5})), shard_rows(x, y, 2))
    a, b = final(plain), final(slowed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match=r"a straggler's factor must be >= 1, found \{0: 0.5\}"):
        Stragglers({0: 0.5})


def test_free_running_workers_share_each_epoch_by_speed_and_nobody_waits_for_the_straggler(digits):
    # real processes over ZeroMQ: rank 0 sleeps 5x its compute every step, rank 1 goes on into fresh
    # permutations of its rows until the job's steps for the epoch (2 x 15) are spent
    x, y = digits
    epochs, steps = 3, -(-240 // 16)
    res = run_processes(spec("downpour", {"serverOptimizer": "sgd"}, epochs=epochs, learningRate=0.1,
                             step_hook=Stragglers({0: 6.0}), torch_threads=1), shard_rows(x, y, 2))
    slow, fast = res[0].info["steps"], res[1].info["steps"]
    assert slow < steps * epochs < fast
    assert epochs * steps * 2 <= slow + fast <= epochs * (steps * 2 + 1)  # at most one step past each target
    hist = res[0].history
    assert sum(h["psUpdates"]["applied"] for h in hist) == slow + fast
    assert hist[-1]["accuracy"] > 0.5  # it learns (chance: 0.1) from 90 steps


def test_a_late_backup_worker_catches_up_by_taking_decided_steps_without_computing(digits):
    # threads: rank 0 sleeps 8x its compute; with one backup worker the other two never wait for it,
    # and it skips the steps they already made instead of computing gradients that would be dropped
    x, y = digits
    res = run_threads(spec("sync", {"backupWorkers": 1}, epochs=2, step_hook=Stragglers({0: 8.0})),
                      shard_rows(x, y, 3))
    steps = 2 * -(-160 // 16)
    assert all(r.info["steps"] == steps for r in res)  # every replica takes every step
    assert res[0].info["computedSteps"] < steps and all(r.info["computedSteps"] == steps for r in res[1:])
    a = final(res)
    assert all(torch.isfinite(v).all() for v in a.values()) and res[0].history[-1]["loss"] < res[0].history[0]["loss"]
    plain = run_threads(spec("sync", epochs=1), shard_rows(x, y, 3))
    assert all(r.info["computedSteps"] == r.info["steps"] for r in plain)


def test_batch_rounds_continue_an_epoch_with_fresh_permutations():
    from irbis.train.worker_data import BatchRounds, epoch_batches

    rounds = BatchRounds(40, 16, 3, seed=0, rank=1, epoch=2, rounds=3)
    assert len(rounds) == 9
    first = epoch_batches(40, 16, 3, 0, 1, 2)
    assert all(np.array_equal(rounds[i], first[i]) for i in range(3))  # round 0 is the epoch itself
    later = np.concatenate([rounds[i] for i in range(3, 6)])
    assert sorted(set(later.tolist())) == list(range(40)) and not np.array_equal(later, np.concatenate(first))
    with pytest.raises(IndexError):
        rounds[9]


def test_dcasgd_with_lambda_zero_is_downpour_on_the_same_schedule(digits):
    x, y = digits
    common = {"serverOptimizer": "sgd", "numShards": 2}
    down = run_threads(spec("downpour", common), shard_rows(x, y, 3))
    dc0 = run_threads(spec("dcasgd", {**common, "lambda_": 0.0}), shard_rows(x, y, 3))
    dc = run_threads(spec("dcasgd", {**common, "lambda_": 2.0}), shard_rows(x, y, 3))
    a, b, c = final(down), final(dc0), final(dc)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)  # the compensation does act on stale updates
    assert down[0].history[-1]["staleness"]["mean"] > 0


@pytest.mark.parametrize("name, options, lr", [("downpour", {}, 0.02), ("mixed", {"groupSize": 2}, 0.05),
                                               ("dcasgd", {}, 0.05)])
def test_each_async_strategy_learns_digits_on_threads(name, options, lr):
    x, y = load_digits(return_X_y=True)
    # four workers each applying their own updates: an effective step about four times ``lr``
    res = run_threads(spec(name, options, epochs=5, learningRate=lr), shard_rows((x / 16).astype(np.float32), y, 4))
    last = res[0].history[-1]
    assert last["accuracy"] > 0.9 and last["psUpdates"]["rejected"] == 0


def test_a_shard_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    shard = ShardState(np.zeros(3, np.float32), optimizer="adagrad", lambda_=0.5)
    shard.pull(1)
    shard.push(0, 1, 0, np.ones(3, np.float32), 0.1)
    shard.push(1, 1, 0, np.full(3, 2.0, np.float32), 0.1)
    torch.save(shard.state_dict(), tmp_path / "shard.pt")
    back = ShardState(np.zeros(3, np.float32), optimizer="adagrad", lambda_=0.5)
    back.load_state_dict(torch.load(tmp_path / "shard.pt", weights_only=True))
    g = np.full(3, 0.5, np.float32)
    assert shard.push(1, 1, 1, g, 0.1) == back.push(1, 1, 1, g, 0.1) == REPLAYED  # last sequence numbers kept
    assert shard.push(1, 2, 1, g, 0.1) == back.push(1, 2, 1, g, 0.1) == APPLIED
    np.testing.assert_array_equal(back.weights, shard.weights)  # optimizer and delay-compensation state kept
    assert back.counts == shard.counts and back.staleness.tolist() == shard.staleness.tolist()
    with pytest.raises(ValueError, match="holds a shard of 3 weights, this shard has 4"):
        ShardState(np.zeros(4, np.float32)).load_state_dict(shard.state_dict())


@pytest.mark.parametrize("name, options, workers", [("downpour", {"numShards": 3, "pushEvery": 2}, 2),
                                                    ("downpour", {"numShards": 2, "placement": "dedicated"}, 2),
                                                    ("mixed", {"groupSize": 2}, 2), ("dcasgd", {"lambda_": 2.0}, 2),
                                                    ("mixed", {"groupSize": 2, "pushEvery": 2}, 4)])
def test_a_crash_mid_epoch_resumes_from_the_saved_shards_losing_no_update(digits, tmp_path, name, options, workers):
    x, y = digits
    crash_once = CrashOnce(at=25 * workers // 2)  # the batches of every worker count: a crash near step 12

    kw = dict(augment=crash_once, prefetch=True, epochs=3)
    ref = run_threads(spec(name, options, **kw), shard_rows(x, y, workers))
    crash_once.arm()
    with pytest.raises(RuntimeError, match="injected"):
        run_threads(spec(name, options, checkpointDir=str(tmp_path), checkpointInterval=5, **kw),
                    shard_rows(x, y, workers))
    res = run_threads(spec(name, options, checkpointDir=str(tmp_path), checkpointInterval=5, **kw),
                      shard_rows(x, y, workers))
    assert res[0].resumed_from == 10
    a, b = final(ref), final(res)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same updates, in the same order, as without the crash
    for got, want in zip(res[0].history, ref[0].history):
        assert got["psUpdates"] == want["psUpdates"] and got["staleness"] == want["staleness"]
        c = got["psUpdates"]
        assert c["pushed"] == c["applied"] + c["rejected"] + c["replayed"] and c["rejected"] == 0


@pytest.mark.parametrize("name, options", [("downpour", {"numShards": 2}), ("mixed", {"groupSize": 2, "numShards": 2})])
def test_dedicated_servers_train_exactly_as_colocated_shards_on_the_lockstep_schedule(digits, name, options):
    x, y = digits
    co = run_threads(spec(name, options, epochs=4), shard_rows(x, y, 2))
    ded = run_threads(spec(name, {**options, "placement": "dedicated"}, epochs=4), shard_rows(x, y, 2))
    assert len(co) == 2 and len(ded) == 4  # two workers, then one server per shard
    assert [r.info["role"] for r in ded[2:]] == ["server", "server"]
    assert [r.info["shards"] for r in ded[2:]] == [[0], [1]]
    assert ded[2].history == [] and ded[2].state is None
    a, b = final(co), final(ded)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert ded[0].history[-1]["accuracy"] > 0.9
    for got, want in zip(ded[0].history, co[0].history):
        assert got.keys() == want.keys()
        assert got["psUpdates"] == want["psUpdates"] and got["staleness"] == want["staleness"]


def test_dedicated_servers_save_their_shard_at_each_cut(digits, tmp_path):
    x, y = digits
    res = run_threads(spec("downpour", {"numShards": 2, "placement": "dedicated"}, epochs=2,
                           checkpointDir=str(tmp_path)), shard_rows(x, y, 2))
    steps = -(-240 // 16)
    assert res[2].info["cuts"] == res[3].info["cuts"] == [steps, 2 * steps]  # one cut per epoch
    saved = sorted(p.name for p in next(tmp_path.glob("step-*")).iterdir())
    assert saved == ["rank-0.pt", "rank-1.pt", "rank-2.pt", "rank-3.pt"]
    shard = torch.load(next(tmp_path.glob("step-*")) / "rank-3.pt", weights_only=True)["server"]["shards"]
    assert list(shard) == [1] and shard[1]["version"] == 2 * 2 * steps  # both workers' pushes, both epochs



@pytest.mark.parametrize("name", ["downpour", "dcasgd"])
def test_a_killed_worker_is_restarted_alone_and_rejoins_losing_no_update(digits, tmp_path, name):
    # shards on this process (the "driver"), workers as processes: one is killed in its second epoch; the
    # restart replays the finished epoch's collectives, pulls the current weights and trains on, while the
    # other two never stop. Every push is applied once: none lost, none taken for a replay.
    from functools import partial

    from irbis.train.faults import kill_once

    x, y = digits
    marker = str(tmp_path / "killed")
    epochs, steps = 4, -(-160 // 16)
    res = run_processes(spec(name, {"placement": "driver", "serverOptimizer": "adagrad"}, epochs=epochs,
                             learningRate=0.05, torch_threads=1, augment=partial(kill_once, marker, steps + 4)),
                        shard_rows(x, y, 3), retries=1)
    import os

    assert os.path.exists(marker), "the fault was never injected"
    assert sorted(r.info["attempt"] for r in res) == [0, 0, 1]  # only the killed worker started again
    hist = [r.history for r in res]
    assert hist[0] == hist[1] == hist[2]  # the restarted worker's records are its peers' (replayed)
    assert [h["epoch"] for h in hist[0]] == [1, 2, 3, 4]
    counts = [h["psUpdates"] for h in hist[0]]
    assert all(c["pushed"] == c["applied"] and c["rejected"] == c["replayed"] == 0 for c in counts)
    assert sum(c["applied"] for c in counts) >= epochs * steps * 3  # the job made all its steps
    assert hist[0][-1]["accuracy"] > 0.8  # 0.9 without the fault; chance is 0.1


def test_driver_shards_refuse_a_checkpoint_dir_and_mixed_refuses_them(digits, tmp_path):
    x, y = digits
    with pytest.raises(ValueError, match="placement='driver' keeps its shards in the driver.*unset it"):
        run_threads(spec("downpour", {"placement": "driver"}, checkpointDir=str(tmp_path)), shard_rows(x, y, 2))
    with pytest.raises(ValueError, match="mixed's groups reduce in lockstep"):
        make_strategy("mixed", placement="driver")
