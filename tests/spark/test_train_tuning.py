"""TorchEstimator's tuning Params on Spark: learning-rate scaling with warm-up, the batch size searched
(batchSize="auto"), BatchNorm statistics recomputed after training, and bad values refused naming the Param."""

import io
import json

import numpy as np
import pytest
import torch
from pyspark.ml.linalg import Vectors

from irbis.ml import TorchEstimator
from irbis.ml.params import ParamValueError
from irbis.train.worker_data import epoch_batches

pytestmark = pytest.mark.spark

MLP = json.dumps({"in_features": 64, "hidden": 32, "out_features": 10})


def estimator(**kw):
    base = dict(network="mlp", networkOptions=MLP, epochs=2, batchSize=16, numWorkers=2, optimizer="sgd",
                learningRate=0.05, showProgress=False, seed=3)
    return TorchEstimator(**{**base, **kw})


def weights(est):
    return torch.load(io.BytesIO(est.last_results[0].state), weights_only=True)


def test_linear_scaling_on_two_sync_workers_doubles_the_rate(train_df):
    scaled, by_hand = estimator(lrScaling="linear"), estimator(learningRate=0.1)
    scaled.fit(train_df)
    by_hand.fit(train_df)
    a, b = weights(scaled), weights(by_hand)
    assert all(torch.equal(a[k], b[k]) for k in a)


def recording_sgd(folder):
    """An optimizer factory: SGD at rate 0.05 that appends the rate of each of its steps to a file of its
    worker process in ``folder``."""

    def make(params):
        import os

        opt = torch.optim.SGD(params, lr=0.05)

        def record(optimizer, args, kwargs):
            with open(os.path.join(folder, f"rates-{os.getpid()}.txt"), "a") as f:
                f.write(f"{optimizer.param_groups[0]['lr']!r}\n")

        opt.register_step_pre_hook(record)
        return opt

    return make


def test_warm_up_climbs_step_by_step_from_the_base_rate_to_the_scaled_one(train_df, tmp_path):
    model = estimator(optimizer=recording_sgd(str(tmp_path)), lrScaling="linear", warmupEpochs=1.0).fit(train_df)
    assert len(model.training_summary) == 2
    files = sorted(tmp_path.glob("rates-*.txt"))
    assert len(files) == 2  # one per worker
    for path in files:
        rates = [float(line) for line in path.read_text().split()]
        steps = len(rates) // 2
        assert len(rates) == 2 * steps and steps > 10
        # two sync workers of 16 rows: the scaled rate is 0.1; the first epoch climbs to it from 0.05
        expected = [0.05 * (1 + min(1.0, k / steps)) for k in range(2 * steps)]
        np.testing.assert_allclose(rates, expected, rtol=1e-12)


@pytest.fixture(scope="module")
def image_df(spark, digits):
    """240 training digits as 3x32x32 images, one partition."""
    xtr, _, ytr, _ = digits
    x = np.repeat(np.kron(xtr[:240].reshape(-1, 1, 8, 8), np.ones((1, 1, 4, 4))), 3, axis=1).reshape(240, -1)
    return spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(x, ytr[:240])],
                                 ["features", "label"]).coalesce(1).cache()


def test_recompute_always_under_sync_gives_update_bn_statistics(image_df):
    from torch.optim.swa_utils import update_bn

    from irbis.models import build_model

    kw = dict(network="small_cnn", networkOptions='{"width": 4}', inputShape=[3, 32, 32], numWorkers=1, epochs=1)
    always, never = estimator(recomputeBatchNorm="always", **kw), estimator(recomputeBatchNorm="never", **kw)
    always.fit(image_df)
    never.fit(image_df)
    got, kept = weights(always), weights(never)
    for k, v in got.items():  # the same training; only the statistics differ
        if "running_" not in k and "num_batches" not in k:
            assert torch.equal(v, kept[k]), k
    net = build_model("small_cnn", width=4)
    net.load_state_dict(got)
    # the worker's rows in the order the backend deals them (by their content, see SparkBarrierBackend)
    from irbis.spark.barrier import SparkBarrierBackend
    from irbis.spark.training import training_frame

    dealt = SparkBarrierBackend(image_df.sparkSession, 1)._partitioned(training_frame(image_df, "features", "label"))
    x = torch.from_numpy(np.stack([np.asarray(r[0], np.float32) for r in dealt.collect()]))
    with torch.no_grad():  # the worker's 15 shuffled batches of 16, a pass after the last epoch
        update_bn([x[ids].view(-1, 3, 32, 32) for ids in epoch_batches(240, 16, 15, 3, 0, 1)], net)
    expected = net.state_dict()
    for k in got:
        if "running_" in k:
            assert torch.allclose(got[k], expected[k], atol=1e-5), k
            assert not torch.allclose(kept[k], expected[k], atol=1e-3), k


@pytest.mark.parametrize(("params", "param", "allowed"), [
    ({"lrScaling": "cubic"}, "lrScaling", "one of 'none', 'linear', 'sqrt'"),
    ({"recomputeBatchNorm": "sometimes"}, "recomputeBatchNorm", "one of 'auto', 'always', 'never'"),
    ({"warmupEpochs": -1.0}, "warmupEpochs", "a number >= 0"),
    ({"referenceBatchSize": -8}, "referenceBatchSize", "a number >= 0"),
    ({"batchSize": 0}, "batchSize", "'auto' or an integer >= 1"),
    ({"autoBatchTolerance": 1.0}, "autoBatchTolerance", "a number > 0 and < 1"),
])
def test_bad_values_are_refused_when_set(params, param, allowed):
    with pytest.raises(ParamValueError, match=param) as info:
        estimator(**params)
    assert info.value.name == param and allowed in str(info.value)


def test_warm_up_not_shorter_than_training_or_without_scaling_is_refused_at_fit(train_df):
    with pytest.raises(ParamValueError, match=r"warmupEpochs=2\.0 .* below epochs=2"):
        estimator(lrScaling="linear", warmupEpochs=2.0).fit(train_df)
    with pytest.raises(ParamValueError, match=r"warmupEpochs=1\.0 .* while lrScaling is 'none'"):
        estimator(warmupEpochs=1.0).fit(train_df)


def test_auto_batch_size_is_searched_on_the_workers_and_saved_with_the_model(train_df, tmp_path):
    est = estimator(batchSize="auto", autoBatchSizes="[8, 16, 32]", autoBatchEvery=2, epochs=3,
                    lrScaling="linear")
    model = est.fit(train_df)
    summary = model.training_summary
    assert [("batchTrials" in r) for r in summary] == [True, False, True]  # epochs 1 and 3
    assert all(r["batchSize"] in (8, 16, 32) for r in summary)
    assert summary[1]["batchSize"] == summary[0]["batchSize"]
    assert summary[0]["trialSamples"] > 0 and "start" in summary[0]["batchTrials"]
    est.save(str(tmp_path / "est"))
    assert TorchEstimator.load(str(tmp_path / "est")).getBatchSize() == "auto"
    with pytest.raises(ParamValueError, match="batchSize.*staleness"):
        estimator(batchSize="auto", strategy="downpour").fit(train_df)
