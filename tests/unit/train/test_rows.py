"""A worker's rows behind one interface: every kind yields every row each epoch, and rows in memory batch as
epoch_batches and iterate do."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from irbis.train.loop import TrainSpec, worker_rows
from irbis.train.networks import network_spec
from irbis.train.ragged import RaggedRows
from irbis.train.rows import BatchPlan, Rows, TensorRows
from irbis.train.stream import FEATURES, LABEL, InputFormat, StreamRows, read_partition
from irbis.train.worker_data import BatchRounds, Shard, batch_rng, epoch_batches, iterate

N = 300


def ragged(n=N, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.empty(n, dtype=object)
    for i in range(n):
        rows[i] = rng.integers(1, 20, rng.integers(1, 40)).astype(np.int64)
    return rows


def arrow(x, sequences, per=37):
    for s in range(0, len(x), per):
        values = [r.tolist() for r in x[s:s + per]]
        feats = pa.array(values, pa.list_(pa.int64())) if sequences else pa.array(values)
        yield pa.RecordBatch.from_arrays([feats, pa.array(np.arange(s, s + len(values)), pa.float64())],
                                         [FEATURES, LABEL])


def spec(sequences=False, **kw):
    net = network_spec("gru_classifier", {"vocab_size": 20, "embed": 8, "hidden": 16}) if sequences else \
        network_spec("mlp", {"in_features": 4, "hidden": 8, "out_features": N})
    return TrainSpec.of(**{"network": net, "batchSize": 16, "tokenBudget": 256, **kw})


def kinds():
    """(name, rows, spec) of each kind, a row's label its index."""
    from irbis.train.networks import build_network

    x = np.arange(N, dtype=np.float32)[:, None].repeat(4, 1)
    seqs = ragged()
    mlp, gru = build_network(spec().network), build_network(spec(True).network)
    dense, _, _ = worker_rows(Shard(x, np.arange(N)), spec(), 0, mlp)
    held, _, _ = worker_rows(Shard(seqs, np.arange(N)), spec(True), 0, gru)
    spilled, _ = read_partition(arrow(x, False), InputFormat("vector", [4]), 64)
    streamed, _, _ = worker_rows(spilled, spec(input_format=InputFormat("vector", [4])), 0, mlp)
    spilled_seqs, _ = read_partition(arrow(seqs, True), InputFormat("sequence"), 64)
    streamed_seqs, _, _ = worker_rows(spilled_seqs, spec(True, input_format=InputFormat("sequence")), 0, gru)
    return [("tensor", dense, TensorRows), ("ragged", held, RaggedRows), ("stream", streamed, StreamRows),
            ("stream sequences", streamed_seqs, StreamRows)]


@pytest.fixture(scope="module")
def all_kinds():
    return kinds()


def test_each_kind_of_shard_gives_its_kind_of_rows_behind_the_interface(all_kinds):
    for name, rows, kind in all_kinds:
        assert type(rows) is kind and isinstance(rows, Rows), name
        assert len(rows) == N and sorted(rows.labels().tolist()) == list(range(N)), name


@pytest.mark.parametrize("epoch", [0, 3])
def test_every_kind_yields_every_row_in_an_epoch_and_once_in_evaluation(all_kinds, epoch):
    for name, rows, _ in all_kinds:
        steps = rows.step_count(16, 5, 1, 4)
        batches = list(rows.train_batches(BatchPlan(16, steps, 5, 1, epoch)))
        assert len(batches) == steps, name
        seen = np.concatenate([yb.numpy() for _, yb in batches])
        # the first pass holds every row once; fixed-size batches top the last one up with rows drawn again
        assert sorted(seen[:N].tolist()) == list(range(N)), name
        if name == "ragged":
            assert len(seen) == N
        other = np.concatenate([yb.numpy() for _, yb in rows.train_batches(BatchPlan(16, steps, 5, 1,
                                                                                       epoch + 1))])
        assert not np.array_equal(seen, other), name  # a fresh order every epoch
        evaluated = np.concatenate([yb.numpy() for _, yb in rows.eval_batches(64, "cpu", np.int64)])
        assert sorted(evaluated.tolist()) == list(range(N)), name
        assert len(list(rows.norm_inputs(BatchPlan(16, 3, 5, 1, epoch)))) == 3, name
        assert rows.nonfinite_rows() == 0, name


def test_rows_in_memory_batch_as_epoch_batches_and_iterate_do():
    x, y = torch.randn(50, 3), torch.arange(50)
    rows = TensorRows(x, y)

    def noise(batch, rng):
        return batch + rng.normal(size=batch.shape)

    for prefetch in (False, True):
        got = list(rows.train_batches(BatchPlan(16, 4, 7, 1, 2, start=1, augment=noise, prefetch=prefetch)))
        want = list(iterate(x, y, epoch_batches(50, 16, 4, 7, 1, 2), noise, lambda i: batch_rng(7, 1, 2, i),
                            False, 1))
        assert len(got) == len(want) == 3
        assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, want))
    rounds = [yb for _, yb in rows.train_batches(BatchPlan(16, 4, 7, 1, 2, rounds=3))]
    assert [b.tolist() for b in rounds] == [b.tolist() for b in BatchRounds(50, 16, 4, 7, 1, 2, 3)]
    normed = list(rows.norm_inputs(BatchPlan(16, 4, 7, 1, 2)))
    assert all(torch.equal(a, x[torch.from_numpy(ids)]) for a, ids in zip(normed, epoch_batches(50, 16, 4, 7, 1, 2)))
    assert rows.step_count(16, 7, 1, 3) == 4 and rows.row_bytes() == 12
    sample = rows.sample(np.array([3, 8, 9, 20]), "cpu", np.int64)
    assert [yb.tolist() for _, yb in sample(1, 4, 2)] == [[8, 9], [20]]
    x[5, 1] = float("nan")
    y2 = y.double()
    assert TensorRows(x, y2).nonfinite_rows() == 1
