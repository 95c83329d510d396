"""The parameter-server strategies on real Spark (local[2]): ZeroMQ between the barrier tasks, digits learned."""

import json

import numpy as np
import pandas as pd
import pytest

from irbis.ml import TorchEstimator
from irbis.models import build_model

pytestmark = pytest.mark.spark

MLP = json.dumps({"in_features": 64, "hidden": 64, "out_features": 10})
RUNS = {"downpour": ('{"numShards": 3}', 0.02), "mixed": ('{"groupSize": 2}', 0.05),
        "dcasgd": ('{"lambda_": 2.0}', 0.1)}


def estimator(**kw):
    base = dict(network="mlp", networkOptions=MLP, epochs=8, batchSize=16, numWorkers=2, optimizer="sgd",
                validationFraction=0.1, showProgress=False)
    return TorchEstimator(**{**base, **kw})


@pytest.fixture(scope="module")
def fitted(train_df):
    return {name: estimator(strategy=name, strategyOptions=opts, learningRate=lr).fit(train_df)
            for name, (opts, lr) in RUNS.items()}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_async_strategy_reaches_high_test_accuracy_and_counts_every_update(fitted, digits, name):
    _, xte, _, yte = digits
    model = fitted[name]
    out = model.transform(pd.DataFrame({"features": list(xte.astype(np.float32))}))
    assert float((np.stack(out["prediction"].map(np.asarray)).argmax(1) == yte).mean()) >= 0.9
    summary = model.training_summary
    steps = sum(r["psUpdates"]["applied"] for r in summary)
    assert all(r["psUpdates"]["rejected"] == 0 and r["psUpdates"]["replayed"] == 0 for r in summary)
    assert all(r["psUpdates"]["pushed"] == r["psUpdates"]["applied"] for r in summary)  # none lost
    assert steps > 0 and summary[-1]["staleness"]["updates"] == summary[-1]["psUpdates"]["applied"]
    assert sum(summary[-1]["staleness"]["histogram"]) == summary[-1]["staleness"]["updates"]


def test_mixed_with_one_group_has_no_staleness_and_pushes_half_of_downpours_bytes(fitted):
    # groupSize == numWorkers: the two workers all-reduce, the leader alone pushes, so no update is stale
    mixed, downpour = fitted["mixed"].training_summary, fitted["downpour"].training_summary
    assert all(r["staleness"]["max"] == 0 for r in mixed)
    params = sum(p.numel() for p in build_model("mlp", **json.loads(MLP)).parameters())
    assert all(m["pushedBytesPerStep"] == d["pushedBytesPerStep"] / 2 == params * 4 / 2
               for m, d in zip(mixed, downpour))


def test_a_group_size_that_does_not_divide_the_workers_fails_before_training(train_df):
    with pytest.raises(ValueError, match="groupSize=3 does not divide numWorkers=2"):
        estimator(strategy="mixed", strategyOptions='{"groupSize": 3}').fit(train_df)


def test_downpour_with_a_dedicated_server_learns_digits_on_its_own_barrier_task(train_df, digits):
    # local[2]: one worker and one dedicated server fill the two slots; the server's partition is empty
    est = estimator(strategy="downpour", strategyOptions='{"numShards": 1, "placement": "dedicated"}',
                    learningRate=0.02, numWorkers=1)
    model = est.fit(train_df)
    _, xte, _, yte = digits
    out = model.transform(pd.DataFrame({"features": list(xte.astype(np.float32))}))
    assert float((np.stack(out["prediction"].map(np.asarray)).argmax(1) == yte).mean()) >= 0.9
    worker, server = est.last_results
    assert server.info["role"] == "server" and server.info["shards"] == [0] and server.history == []
    summary = model.training_summary
    assert all(r["psUpdates"]["pushed"] == r["psUpdates"]["applied"] > 0 for r in summary)
    assert sum(summary[-1]["staleness"]["histogram"]) == summary[-1]["staleness"]["updates"]
    assert server.info["version"] == sum(r["psUpdates"]["applied"] for r in summary)


def test_dedicated_servers_beyond_the_slots_fail_before_training_naming_both_counts(train_df):
    est = estimator(strategy="downpour", strategyOptions='{"numShards": 2, "placement": "dedicated"}')
    with pytest.raises(ValueError, match="numWorkers=2 and 2 dedicated parameter servers need 4 barrier tasks"):
        est.fit(train_df)


@pytest.mark.classic_only(reason="placement='driver' needs a classic session, whose executors reach the driver "
                                 "(test_connect checks the error on Connect)")
def test_shards_on_the_driver_train_digits_in_an_ordinary_stage(train_df, digits):
    # placement="driver": no barrier stage, collectives through the driver's store, ZeroMQ to the driver
    est = estimator(strategy="dcasgd", strategyOptions='{"placement": "driver"}', learningRate=0.1)
    model = est.fit(train_df)
    _, xte, _, yte = digits
    out = model.transform(pd.DataFrame({"features": list(xte.astype(np.float32))}))
    assert float((np.stack(out["prediction"].map(np.asarray)).argmax(1) == yte).mean()) >= 0.9
    assert [r.info["attempt"] for r in est.last_results] == [0, 0]  # ordinary tasks, each on its first attempt
    assert est.last_results[0].history == est.last_results[1].history
    summary = model.training_summary
    assert all(r["psUpdates"]["pushed"] == r["psUpdates"]["applied"] > 0 for r in summary)
