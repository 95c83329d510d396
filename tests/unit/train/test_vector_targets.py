"""Vector labels and several inputs without Spark: the loss registry, the labels' reading and checks, the
network that takes several inputs, and training on the thread backend."""

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from irbis.kernels.blocks import Tensor
from irbis.ml import TorchModel
from irbis.train.backends.local import run_threads, shard_rows
from irbis.train.checks import check_label_kind, merge_profiles, shard_profile
from irbis.train.loop import TrainSpec
from irbis.train.networks import SplitInputs, build_network, network_spec
from irbis.train.optim import LOSSES, loss_label_dtype, losses_doc, make_loss
from irbis.train.stream import label_rows, stack_labels


def test_every_loss_of_the_registry_is_documented_and_takes_its_labels():
    out = torch.randn(6, 3)
    targets = {"index": torch.tensor([0, 2, 1, 0, 1, 2]), "number_or_vector": torch.rand(6, 3),
               "vector": torch.softmax(torch.randn(6, 3), 1)}
    for name, entry in LOSSES.items():
        assert f"'{name}'" in losses_doc()
        assert torch.isfinite(make_loss(name)(out, targets[entry.labels]))
    assert loss_label_dtype("cross_entropy") == np.int64 and loss_label_dtype("bce") == np.float32
    y = torch.tensor([[1.0, 0.0, 1.0]])
    assert torch.allclose(make_loss("bce")(out[:1], y),
                          torch.nn.functional.binary_cross_entropy_with_logits(out[:1], y))


def test_vector_labels_are_read_with_nulls_and_widths():
    a = pa.array([[9.0], [1.0, 0.0], None, [0.5, 0.5]], pa.list_(pa.float32())).slice(1)
    b = pa.array([[0.0, 1.0, 0.0]], pa.list_(pa.float32()))
    y, widths = stack_labels([label_rows(a), label_rows(b)])
    assert y.shape == (4, 3) and widths.tolist() == [2, 0, 2, 3]
    assert np.isnan(y[1]).all() and np.isnan(y[0, 2])
    np.testing.assert_array_equal(y[[0, 2, 3]][:, :2], [[1, 0], [0.5, 0.5], [0, 1]])
    assert stack_labels([label_rows(pa.array([1.0, None]))])[1] is None


def profile(labels, widths):
    return merge_profiles([shard_profile(np.full(len(labels), 8.0), labels, 0, label_widths=widths)])


def test_label_checks_name_the_column_width_and_kind():
    y = np.array([[1.0, 0.0], [0.0, 1.0]])
    check_label_kind(profile(y, np.array([2, 2])), "bce", "tags")
    with pytest.raises(ValueError, match="labelCol 'tags' holds vectors of different widths"):
        check_label_kind(profile(np.array([[1.0, 0.0], [0.0, np.nan]]), np.array([2, 1])), "bce", "tags")
    with pytest.raises(ValueError, match="takes a class index per row; use loss='soft_cross_entropy'"):
        check_label_kind(profile(y, np.array([2, 2])), "cross_entropy", "tags")
    with pytest.raises(ValueError, match="holds numbers, but loss='soft_cross_entropy' takes a vector"):
        check_label_kind(profile(np.array([0.0, 1.0]), None), "soft_cross_entropy", "y")
    with pytest.raises(ValueError, match="values from 0 to 3; loss='bce' takes 0/1"):
        check_label_kind(profile(y * 3, np.array([2, 2])), "bce", "tags")
    check_label_kind(profile(np.array([[0.25, 0.75], [0.5, 0.5]]), np.array([2, 2])), "soft_cross_entropy", "p")
    with pytest.raises(ValueError, match=r"labelCol 'votes' holds rows summing to 2\.\.3; .*divide each row"):
        check_label_kind(profile(np.array([[1.0, 1.0], [2.0, 1.0]]), np.array([2, 2])), "soft_cross_entropy",
                         "votes")


def test_split_inputs_hands_the_network_its_inputs_in_order():
    seen = []

    class Two(torch.nn.Module):
        def forward(self, a, b):
            seen.append((a.shape, b.shape))
            return a.sum(1, keepdim=True) - b.flatten(1).sum(1, keepdim=True)

    x = torch.arange(14.0).reshape(2, 7)
    out = SplitInputs(Two(), [[3], [2, 2]])(x)
    assert seen == [(torch.Size([2, 3]), torch.Size([2, 2, 2]))]
    assert out[:, 0].tolist() == [(0 + 1 + 2) - (3 + 4 + 5 + 6), (7 + 8 + 9) - (10 + 11 + 12 + 13)]
    spec = {**network_spec("mlp", {"in_features": 7, "hidden": 4, "out_features": 2}), "inputs": [[7]]}
    assert isinstance(build_network(spec), SplitInputs)


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_a_model_of_two_columns_gives_null_where_either_is_null(engine):
    if engine != "torch":
        pytest.importorskip(engine)

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 2), torch.nn.Linear(4, 2)

        def forward(self, a, b):
            return self.a(a) + self.b(b.flatten(1))

    net = Two().eval()
    stage = TorchModel.from_module(net, inputCols=["a", "b"], inputShapes=[[3], [2, 2]], outputCol="y",
                                   engine=engine)
    a = [np.full(3, i, np.float32) for i in range(3)]
    b = [np.arange(4, dtype=np.float32), None, np.ones(4, np.float32)]
    out = stage.transform(pd.DataFrame({"a": a, "b": b}))["y"]
    assert out[1] is None
    kernel = stage.kernel()  # what serving runs: the same two columns
    assert kernel.inputs == ["a", "b"]
    served = kernel.fn({"a": Tensor(np.stack(a), np.ones(3, bool)), "b": Tensor(np.stack(b[::2]),
                                                                                np.array([True, False, True]))})
    np.testing.assert_allclose(np.asarray(served["y"].values), np.stack([out[0], out[2]]), atol=1e-6)
    with torch.no_grad():
        ref = net(torch.tensor(np.stack([a[0], a[2]])), torch.tensor(np.stack([b[0], b[2]])).reshape(2, 2, 2))
    np.testing.assert_allclose(np.stack([out[0], out[2]]), ref.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="needs inputShapes"):
        TorchModel.from_module(net, inputCols=["a", "b"], outputCol="y")
    with pytest.raises(ValueError, match="inputCol 'a' and inputCols"):
        stage.copy().setInputCol("a").transform(pd.DataFrame({"a": a, "b": b}))


@pytest.mark.parametrize("strategy", ["sync", "downpour"])
def test_multi_label_learns_on_the_thread_backend_under_sync_and_a_parameter_server(strategy):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 3)) > 0).astype(np.float32)
    spec = TrainSpec.of(network=network_spec("mlp", {"in_features": 6, "hidden": 16, "out_features": 3}),
                        epochs=20, batchSize=32, optimizer="adam", learningRate=1e-2, loss="bce", strategy=strategy,
                        validationFraction=0.2)
    res = run_threads(spec, shard_rows(x[:600], y[:600], 2))
    net = build_network(spec.network)
    net.load_state_dict(torch.load(io.BytesIO(res[0].state), weights_only=True))
    with torch.no_grad():
        acc = ((net(torch.tensor(x[600:])) > 0).numpy() == y[600:]).mean()
    last = res[0].history[-1]
    assert last["loss"] < res[0].history[0]["loss"] and acc > 0.9
    assert last["accuracy"] > 0.85  # the validation rows' share of per-class decisions right



def test_a_regression_reports_no_accuracy_where_a_classifier_does():
    """mse's targets say nothing of right and wrong: its records have accuracy None, not a 0.0 that reads as a
    network that learned nothing; the validation loss still falls."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = (x @ rng.normal(size=(4, 2))).astype(np.float32)
    net = network_spec("mlp", {"in_features": 4, "hidden": 8, "out_features": 2})
    spec = TrainSpec.of(network=net, epochs=3, batchSize=32, optimizer="adam", learningRate=1e-2, loss="mse",
                        validationFraction=0.2)
    history = run_threads(spec, shard_rows(x, y, 2))[0].history
    assert [r["accuracy"] for r in history] == [None] * 3
    assert history[-1]["validationLoss"] < history[0]["validationLoss"]
    labels = (y[:, 0] > 0).astype(np.int64)
    spec = TrainSpec.of(network=net, epochs=1, batchSize=32, optimizer="adam", learningRate=1e-2,
                        validationFraction=0.2)
    assert 0.0 <= run_threads(spec, shard_rows(x, labels, 2))[0].history[-1]["accuracy"] <= 1.0

def test_vector_labels_travel_with_their_rows_through_a_spill_file():
    from irbis.train.rows import BatchPlan
    from irbis.train.stream import FEATURES, LABEL, InputFormat, SpilledShard, read_partition

    def batches():
        for s in range(0, 600, 37):
            ids = np.arange(s, min(s + 37, 600))
            x = ids[:, None].repeat(4, 1).astype(np.float32)
            y = np.stack([ids % 2, ids % 3 == 0, np.full(len(ids), np.nan if s == 37 else 1.0)], 1)
            yield pa.RecordBatch.from_arrays([pa.array(list(x)), pa.array(list(y.astype(np.float32)))],
                                             [FEATURES, LABEL])

    shard, profile = read_partition(batches(), InputFormat("vector", [4]), buffer_rows=100)
    assert isinstance(shard, SpilledShard) and shard.labels.shape == (600, 3)
    rows, _, skipped = shard.split(0.0, 0, "skip")
    assert skipped == 37 and len(rows) == 563  # the batch of NaN labels is left out under nanPolicy='skip'
    for xb, yb in rows.batches(BatchPlan(50, 11, 0, 0, 0, label_dtype=np.float32)):
        ids = xb[:, 0].numpy().astype(int)
        assert yb.shape == (50, 3)
        np.testing.assert_array_equal(yb[:, :2].numpy(), np.stack([ids % 2, ids % 3 == 0], 1))
    shard.close()


def test_a_network_ending_in_its_activation_is_stored_as_an_export_for_one_input_or_several():
    from irbis.train.networks import Activated

    one = TorchModel.from_module(Activated(torch.nn.Linear(3, 2), torch.nn.Sigmoid()).eval(), inputCol="x",
                                 inputShape=[3], outputCol="y", engine="torch")
    assert one.getNetwork().endswith(".pt2")
    out = one.transform(pd.DataFrame({"x": [np.full(3, 9, np.float32)]}))["y"][0]
    assert ((out > 0) & (out < 1)).all()

    class Two(torch.nn.Module):
        def forward(self, a, b):
            return a - b

    two = TorchModel.from_module(Activated(Two(), torch.nn.Sigmoid()).eval(), inputCols=["a", "b"],
                                 inputShapes=[[2], [2]], outputCol="y", engine="torch")
    out = two.transform(pd.DataFrame({"a": [np.array([1, 0], np.float32)], "b": [np.array([0, 1], np.float32)]}))
    np.testing.assert_allclose(out["y"][0], torch.sigmoid(torch.tensor([1.0, -1.0])).numpy(), rtol=1e-6)
