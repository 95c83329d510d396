"""TorchEstimator refuses what cannot train, early and by name, and never returns a silently broken model."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from pyspark.ml.linalg import Vectors

from irbis.errors import NonFiniteLossError
from irbis.ml import TorchEstimator
from irbis.ml.params import ParamValueError
from irbis.spark.barrier import available_slots, partition_keys, spark_hash_long

pytestmark = pytest.mark.spark

NET = json.dumps({"in_features": 2, "hidden": 8, "out_features": 2})


def estimator(**kw):
    base = dict(network="mlp", networkOptions=NET, epochs=2, batchSize=4, numWorkers=2, showProgress=False,
                inputCol="vec")
    return TorchEstimator(**{**base, **kw})


@pytest.fixture(scope="module")
def rows():
    return [(Vectors.dense([float(i % 7), float(i % 2)]), i % 2) for i in range(40)]


@pytest.fixture(scope="module")
def nan_df(spark, rows):
    bad = list(rows)
    bad[3] = (Vectors.dense([float("nan"), 1.0]), 1)
    return spark.createDataFrame(bad, ["vec", "label"])


def test_one_nan_feature_is_refused_naming_the_column_and_count(nan_df):
    with pytest.raises(ValueError, match=r"1 rows of inputCol 'vec' or labelCol 'label' hold NaN .*nanPolicy='skip'"):
        estimator().fit(nan_df)


def test_nan_policy_skip_trains_without_the_rows_and_counts_them(nan_df):
    model = estimator(nanPolicy="skip").fit(nan_df)
    assert [r["skippedRows"] for r in model.training_summary] == [1, 1]
    assert all(np.isfinite(r["loss"]) for r in model.training_summary)
    out = model.transform(pd.DataFrame({"vec": [np.array([1.0, 0.0], np.float32)]}))["prediction"][0]
    assert np.isfinite(np.asarray(out)).all()


def test_empty_frame_and_too_few_rows_fail_before_the_barrier_stage(spark, rows):
    df = spark.createDataFrame(rows, ["vec", "label"])
    with pytest.raises(ValueError, match="training DataFrame is empty.*numWorkers=2"):
        estimator().fit(df.limit(0))
    with pytest.raises(ValueError, match="has only 1 rows.*numWorkers=2"):
        estimator().fit(df.limit(1))


def test_more_workers_than_local_slots_is_answered_from_the_master(spark, rows):
    # a local master adds no executors: the answer comes from spark.master, with no wait (an infinite one here)
    assert available_slots(spark, wanted=8, wait_s=float("inf")) == 2
    with pytest.raises(ValueError, match="numWorkers=8 but the cluster can run only 2 tasks"):
        estimator(numWorkers=8).fit(spark.createDataFrame(rows, ["vec", "label"]))


def test_huge_learning_rate_warns_in_the_summary_and_the_driver_log(spark, caplog):
    # labels drawn apart from the features, and rows alike in features with both labels: after one step of
    # rate 1e6 the logits are huge and about half of every later batch is wrong by as much, whatever the
    # order (on separable rows one such step can make the last batch right, its loss 0, and no warning)
    labels = np.random.default_rng(0).integers(0, 2, 40)
    rows = [(Vectors.dense([float(i % 5), float(i % 3)]), int(b)) for i, b in enumerate(labels)]
    with caplog.at_level("WARNING", logger="irbis.ml.estimator"):
        model = estimator(learningRate=1e6, epochs=1).fit(spark.createDataFrame(rows, ["vec", "label"]))
    assert "the loss grew from" in model.training_summary[0]["warning"]
    assert any("epoch 1: the loss grew from" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU (the gpu test runs there)")
def test_cuda_on_a_cpu_local_master_fails_at_fit_start_on_the_driver(spark, rows):
    df = spark.createDataFrame(rows, ["vec", "label"])
    with pytest.raises(ParamValueError, match="device='cuda'.*no CUDA device"):
        estimator(device="cuda").fit(df)


@pytest.mark.gpu
def test_cuda_fit_learns_the_label(spark, rows):
    """One worker: NCCL refuses two ranks on one GPU. Skipped without a GPU; its path on the CPU: fits on Spark
    that learn, ``test_every_strategy_reaches_high_test_accuracy`` in ``tests/spark/test_train.py``; the loop on
    the run's device against eager torch, ``test_vector_training_on_the_device_follows_eager_torch_on_the_cpu``
    in ``tests/unit/train/test_device_training.py``; device='cuda' refused on the driver of a machine without
    one, ``test_cuda_on_a_cpu_local_master_fails_at_fit_start_on_the_driver`` above. No CPU test covers NCCL."""
    model = estimator(device="cuda", numWorkers=1, epochs=8, learningRate=0.05).fit(
        spark.createDataFrame(rows, ["vec", "label"]))
    losses = [r["loss"] for r in model.training_summary]
    assert len(losses) == 8 and np.isfinite(losses).all() and losses[-1] < losses[0]
    scores = model.transform(pd.DataFrame({"vec": [np.array(v.toArray(), np.float32) for v, _ in rows]}))
    accuracy = np.mean([int(np.argmax(s)) == y for s, (_, y) in zip(scores["prediction"], rows)])
    assert accuracy > 0.9, accuracy  # the label is the second feature


def test_strategy_options_are_checked_against_the_registry_when_set():
    est = estimator(strategy="block_momentum", strategyOptions='{"blockSize": 4}')
    with pytest.raises(ParamValueError, match=r"options of strategy 'one_bit' only"):
        est.setStrategy("one_bit")
    assert est.getStrategy() == "block_momentum"
    copied = est.copy({est.numWorkers: 1})  # copy() sets the Params one at a time
    assert (copied.getStrategy(), copied.getStrategyOptions()) == ("block_momentum", '{"blockSize": 4}')
    with pytest.raises(ParamValueError, match="blockSize"):
        est.setStrategyOptions('{"blockSize": 0}')
    with pytest.raises(ParamValueError, match="miniBatch|batchSize"):
        estimator(batchSize=0)


def test_non_finite_loss_error_crosses_from_the_workers_with_its_fields():
    from irbis.errors import from_record, to_record, with_fields

    err = from_record(to_record(with_fields(NonFiniteLossError("loss NaN at epoch 1, step 2"), epoch=1, step=2)))
    assert isinstance(err, NonFiniteLossError) and err.fields == {"epoch": 1, "step": 2}


def test_partition_keys_land_where_sparks_hash_partitioning_sends_them(spark):
    from pyspark.sql import functions as F

    ids = list(range(-3, 40)) + [2 ** 40 + 7, -(2 ** 50)]
    got = spark.createDataFrame([(i,) for i in ids], "id long").select("id", F.hash("id").alias("h")).collect()
    assert {r["id"]: r["h"] for r in got} == {i: spark_hash_long(i) for i in ids}
    for n in (1, 2, 3, 5):
        keys = partition_keys(n)
        assert sorted(keys) == list(range(n))
        rows = (spark.createDataFrame([(k,) for k in keys.values()], "k long").repartition(n, "k")
                .select("k", F.spark_partition_id().alias("p")).collect())
        assert {r["p"]: r["k"] for r in rows} == keys


def test_the_workers_rows_and_their_order_do_not_depend_on_the_inputs_row_order(spark):
    """A partition read from a shuffle comes in no fixed order (its map outputs in the order they arrive):
    the rows each rank trains on, and their order, follow from the rows alone, so that a retried barrier
    stage resumes on the batches its checkpoint was cut in. The frame is made twice, its partitions' rows in
    reverse order the second time; a dealing by arrival position gives other ranks and another order."""
    from pyspark.sql import functions as F

    from irbis.spark.barrier import SparkBarrierBackend

    rows = [(i, float(i) / 3, [i, i + 1], {"k": i}) for i in range(24)]
    schema = "id int, x double, a array<int>, m map<string,int>"  # a map column, which Spark cannot hash

    def dealt(order):
        df = spark.createDataFrame(order, schema).repartition(2, F.col("id") % 2)
        out = SparkBarrierBackend(spark, 3, data_ranks=2)._partitioned(df)
        got = out.select("id", F.spark_partition_id().alias("p")).collect()
        return [[r["id"] for r in got if r["p"] == p] for p in range(3)]

    forward, backward = dealt(rows), dealt(rows[::-1])
    assert forward == backward
    assert sorted(forward[0] + forward[1]) == list(range(24)) and forward[2] == []
    assert abs(len(forward[0]) - len(forward[1])) <= 1  # dealt round-robin: even shares


def test_image_training_jobs_send_small_arrow_batches_and_the_session_setting_comes_back(spark):
    from irbis.spark.training import arrow_batch_rows

    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    with arrow_batch_rows(spark, 64):
        assert spark.conf.get(key) == "64"
        sizes = (spark.range(1000, numPartitions=1)
                 .mapInArrow(lambda batches: (pa.RecordBatch.from_pydict({"n": [b.num_rows]}) for b in batches),
                             "n long").collect())
        assert max(r["n"] for r in sizes) == 64
    assert spark.conf.get(key) == before


@pytest.mark.classic_only(reason="points the session's Python workers at another program (sparkContext)")
def test_executors_that_cannot_run_their_python_fail_the_fit_naming_the_fix(spark, rows, monkeypatch):
    """The commonest first try on a real cluster: the executors' Python is the driver's path, which their
    hosts lack. The JVM cannot start the Python worker; the fit names that Python and the fix."""
    from irbis.errors import ExecutorImportError

    df = spark.createDataFrame(rows, ["vec", "label"])
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "/nowhere/.venv/bin/python")
    with pytest.raises(ExecutorImportError, match=r"cannot run the Python '/nowhere/.venv/bin/python'.*"
                                                  r"irbis pack --output irbis-env.pex.*environment="):
        estimator(epochs=1).fit(df)
