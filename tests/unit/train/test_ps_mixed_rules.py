"""The mixed mode's group all-reduce and leader, and the parameter server's rmsprop, weight decay and custom rules."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from irbis.train.backends.local import run_processes, run_threads, shard_rows
from irbis.train.loop import TrainSpec
from irbis.train.networks import network_spec
from irbis.train.ps.rules import RMSPROP_DECAY, RMSPROP_EPS, SERVER_OPTIMIZERS
from irbis.train.ps.shard import ShardState
from irbis.train.strategies import make_strategy
from irbis.train.strategies.downpour import Downpour
from irbis.train.strategies.mixed import MixedSync
from irbis.train.strategies.sync_sgd import SyncSGD
from train_helpers import run_workers, weights

PARAMS = 6 * 8 + 8 + 8 * 3 + 3  # tiny_net's weights


def test_rmsprop_is_the_iccs_rule_with_epsilon_inside_the_square_root():
    rng = np.random.default_rng(0)
    w = rng.normal(size=5).astype(np.float32)
    want, ms, state = w.astype(np.float64), np.zeros(5), {}
    for _ in range(4):
        g = rng.normal(size=5).astype(np.float32)
        SERVER_OPTIMIZERS["rmsprop"](w, g, 0.1, state)
        ms = 0.9 * ms + 0.1 * g.astype(np.float64) ** 2
        want -= 0.1 * g / np.sqrt(ms + 1.0)
    assert (RMSPROP_DECAY, RMSPROP_EPS) == (0.9, 1.0)
    np.testing.assert_allclose(w, want, rtol=1e-5)
    np.testing.assert_allclose(state["ms"], ms, rtol=1e-5)


def test_server_weight_decay_adds_the_l2_gradient_at_the_current_weights_before_the_rule():
    w0, g = np.array([1.0, -2.0, 0.5], np.float32), np.array([0.3, 0.1, -0.2], np.float32)
    shard = ShardState(w0, optimizer="adagrad", weight_decay=0.01)
    shard.push(0, 1, 0, g, 0.1)
    d = g + 0.01 * w0
    np.testing.assert_allclose(shard.weights, w0 - 0.1 * d / (np.sqrt(d * d) + 1e-8), rtol=1e-6)
    plain = ShardState(w0, optimizer="sgd")
    plain.push(0, 1, 0, g, 0.1)
    np.testing.assert_allclose(plain.weights, w0 - 0.1 * g)  # 0: no decay


def test_a_custom_rule_named_by_reference_runs_on_the_shards_and_in_training():
    shard = ShardState(np.zeros(3, np.float32), optimizer="train_helpers:signed_sgd")
    shard.push(0, 1, 0, np.array([2.0, -0.5, 0.0], np.float32), 0.1)
    np.testing.assert_allclose(shard.weights, [-0.1, 0.1, 0.0])
    assert int(shard.opt_state["n"]) == 1
    x, y = load_digits(return_X_y=True)
    spec = TrainSpec.of(network=network_spec("mlp", {"in_features": 64, "hidden": 32, "out_features": 10}),
                        epochs=2, batchSize=16, optimizer="sgd", learningRate=0.002, strategy="downpour",
                        strategyOptions={"serverOptimizer": "train_helpers:signed_sgd"}, validationFraction=0.2)
    hist = run_threads(spec, shard_rows((x[:600] / 16).astype(np.float32), y[:600], 2))[0].history
    assert hist[-1]["accuracy"] > 0.5  # chance is 0.1


@pytest.mark.parametrize("options, message", [
    ({"serverOptimizer": "adam"}, "serverOptimizer must be one of 'sgd', 'momentum', 'adagrad', 'rmsprop' or "
                                  "'package.module:function', found 'adam'"),
    ({"serverOptimizer": "no_such_module:rule"}, "serverOptimizer 'no_such_module:rule' cannot be imported"),
    ({"serverOptimizer": "train_helpers:PARAMS_NOT_THERE"}, "cannot be imported"),
    ({"serverWeightDecay": -1e-4}, "serverWeightDecay must be a number >= 0, found -0.0001"),
])
def test_bad_server_rules_fail_at_construction_naming_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        make_strategy("mixed", **options)


def test_mixed_with_one_group_of_all_workers_is_sync_sgd_and_with_groups_of_one_is_downpour():
    sgd = {"serverOptimizer": "sgd"}
    mixed = run_workers(2, lambda: MixedSync(groupSize=2, **sgd), steps=6)
    sync = run_workers(2, SyncSGD, steps=6)  # the local SGD at 0.1 on the mean gradient
    torch.testing.assert_close(weights(mixed[0][0]), weights(sync[0][0]))
    ones = run_workers(2, lambda: MixedSync(groupSize=1, **sgd), steps=6)
    down = run_workers(2, lambda: Downpour(**sgd), steps=6)
    assert torch.equal(weights(ones[0][0]), weights(down[0][0]))


@pytest.mark.parametrize("group, push_every", [(2, 1), (4, 1), (2, 3)])
def test_the_leader_alone_pushes_the_group_mean_and_every_member_ends_with_its_weights(group, push_every):
    steps = 6
    out = run_workers(4, lambda: MixedSync(groupSize=group, pushEvery=push_every, serverOptimizer="sgd"), steps)
    pushed = [dopt.strategy.state.pushed_bytes for _, dopt in out]
    per_push = PARAMS * 4
    assert pushed == [per_push * steps // push_every if r % group == 0 else 0 for r in range(4)]
    assert sum(pushed) / (4 * steps) == per_push / push_every / group  # Downpour's bytes over the group size
    final = [weights(model) for model, _ in out]
    assert all(torch.equal(final[0], w) for w in final[1:])
    ref = run_workers(4, lambda: Downpour(pushEvery=push_every, serverOptimizer="sgd"), steps)
    assert sum(d.strategy.state.pushed_bytes for _, d in ref) == group * sum(pushed)


def test_mixed_counts_its_pushes_per_step_beside_downpour_on_threads():
    x, y = load_digits(return_X_y=True)
    x = (x[:600] / 16).astype(np.float32)

    def run(name, options):
        spec = TrainSpec.of(network=network_spec("mlp", {"in_features": 64, "hidden": 32, "out_features": 10}),
                            epochs=2, batchSize=16, optimizer="sgd", learningRate=0.05, strategy=name,
                            strategyOptions=options, validationFraction=0.2)
        return run_threads(spec, shard_rows(x, y[:600], 4))[0].history

    down, mixed = run("downpour", {}), run("mixed", {"groupSize": 2})
    for d, m in zip(down, mixed):
        assert d["pushedBytesPerStep"] == 2410 * 4 and m["pushedBytesPerStep"] == 2410 * 4 / 2
        assert m["psUpdates"]["pushed"] == m["psUpdates"]["applied"] == d["psUpdates"]["applied"] / 2
        assert m["staleness"]["max"] <= 1  # two groups: an update is at most the other group's behind


def test_mixed_groups_over_gloo_subgroups_and_zeromq_learn_and_halve_the_pushes():
    # processes: the groups are torch.distributed subgroups, the shards reached over ZeroMQ
    x, y = load_digits(return_X_y=True)
    spec = TrainSpec.of(network=network_spec("mlp", {"in_features": 64, "hidden": 32, "out_features": 10}),
                        epochs=3, batchSize=16, optimizer="sgd", learningRate=0.05, strategy="mixed",
                        strategyOptions={"groupSize": 2}, validationFraction=0.2, torch_threads=1)
    res = run_processes(spec, shard_rows((x[:800] / 16).astype(np.float32), y[:800], 4))
    hist = res[0].history
    assert all(h["pushedBytesPerStep"] == 2410 * 4 / 2 for h in hist)
    assert all(h["psUpdates"]["pushed"] == h["psUpdates"]["applied"] for h in hist)
    assert hist[-1]["accuracy"] > 0.75  # 0.88 to 0.93 over three seeds; chance is 0.1
