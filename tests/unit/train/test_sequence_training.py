"""Variable-length rows in training: length batches under a token budget, equal steps, the network's input."""

import io
import json
import textwrap

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from irbis.kernels.sequences import length_batches, padded_length
from irbis.train.auto_batch import AutoBatch
from irbis.train.backends.local import run_threads, shard_rows
from irbis.train.loop import TrainSpec, step_autocast
from irbis.train.networks import network_spec
from irbis.train.ragged import RaggedRows, make_batch
from irbis.train.rows import BatchPlan
from irbis.train.stream import FEATURES, LABEL, InputFormat, SpilledShard, read_partition
from irbis.train.worker_data import Shard
from train_helpers import peak_rss_mib, token_task


def rows_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.empty(len(lengths), dtype=object)
    for i, n in enumerate(lengths):
        rows[i] = rng.integers(1, 20, n).astype(np.int64)
    return rows


def spec(**kw):
    base = dict(network=network_spec("gru_classifier", {"vocab_size": 20, "embed": 8, "hidden": 16}), epochs=4,
                batchSize=16, learningRate=1e-2, tokenBudget=512, torch_threads=1)
    return TrainSpec.of(**{**base, **kw})


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=80), budget=st.integers(8, 600),
       max_rows=st.integers(1, 20), epoch=st.integers(0, 5))
def test_every_row_once_per_epoch_and_batches_respect_the_budget(lengths, budget, max_rows, epoch):
    rows = RaggedRows(rows_of(lengths), np.zeros(len(lengths)), "padded", budget, max_rows)
    plan = rows.plan(3, 1, epoch)
    batches = rows.order(len(plan), seed=3, rank=1, epoch=epoch)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    lens = np.asarray(lengths)
    for b in batches:
        assert len(b) <= max_rows
        assert len(b) == 1 or len(b) * padded_length(lens[b]) <= budget
    # a worker with fewer batches than the steps repeats some of them (equal steps across workers)
    more = rows.order(len(plan) + 3, seed=3, rank=1, epoch=epoch)
    assert len(more) == len(plan) + 3
    assert all(any(np.array_equal(b, p) for p in plan) for b in more)
    assert set(np.concatenate(more).tolist()) == set(range(len(lengths)))


def test_batch_order_differs_across_epochs_and_is_reproducible_for_one_seed():
    rows = RaggedRows(rows_of(np.arange(1, 200) % 37 + 1), np.zeros(199), "padded", 256, 16)
    n = len(rows.plan(0, 0, 0))

    def order(epoch, seed=0):
        return [b.tolist() for b in rows.order(n, seed, 0, epoch)]

    assert order(0) == order(0) and order(0) != order(1) and order(0) != order(0, seed=1)


def test_the_workers_of_a_step_take_batches_of_alike_lengths():
    """A synchronous step waits for its slowest worker: two workers with different rows of one length
    distribution take, step by step, batches of about the same padded length, where shuffling each worker's
    batches on its own pairs a short batch with a long one."""
    rng = np.random.default_rng(0)
    workers = [RaggedRows(rows_of(np.minimum(rng.lognormal(4.5, 0.6, 600).astype(int) + 1, 256), seed=k),
                          np.zeros(600), "padded", 4096, 8) for k in range(2)]
    count = max(len(w.plan(0, k, 1)) for k, w in enumerate(workers))
    lengths = [[padded_length(w.lengths[b]) for b in w.order(count, seed=0, rank=k, epoch=1)]
               for k, w in enumerate(workers)]
    # each worker still takes every one of its rows once in the epoch's first pass
    assert all(sorted(np.concatenate(w.order(len(w.plan(0, k, 1)), 0, k, 1)).tolist()) == list(range(600))
               for k, w in enumerate(workers))
    a, b = np.asarray(lengths[0], float), np.asarray(lengths[1], float)
    n = min(len(a), len(b))
    matched = np.maximum(a[:n], b[:n]).sum() / ((a[:n] + b[:n]) / 2).sum()
    alone = np.maximum(a[:n], rng.permutation(b[:n])).sum() / ((a[:n] + b[:n]) / 2).sum()
    assert matched < 1.1 < alone
    assert np.corrcoef(a[:n], b[:n])[0, 1] > 0.85
    # shards holding the same rows (copies of the same texts) never pair a batch with itself in a step
    same = workers[0]
    steps = len(same.plan(0, 0, 1))
    pairs = zip(same.order(steps, seed=0, rank=0, epoch=1), same.order(steps, seed=0, rank=1, epoch=1))
    assert not any(np.array_equal(x, y) for x, y in pairs)


def test_a_batch_reaches_the_network_padded_with_a_mask_or_packed():
    rows = [np.array([5, 6, 7]), np.array([1])]
    (ids, mask), stats = make_batch(rows, "padded")
    assert ids.dtype == torch.int64 and ids.shape == (2, 8) and ids[0, :4].tolist() == [5, 6, 7, 0]
    assert mask.sum(1).tolist() == [3, 1] and (stats.tokens, stats.padded) == (4, 16)
    packed, _ = make_batch(rows, "packed")
    assert isinstance(packed, torch.nn.utils.rnn.PackedSequence) and packed.batch_sizes.tolist() == [2, 1, 1]
    # rows of float vectors (steps x features): float32 (B, T, F) in place of the ids
    (steps, mask), _ = make_batch([np.ones((3, 2), np.float32), np.full((9, 2), 2, np.float32)], "padded")
    assert steps.dtype == torch.float32 and steps.shape == (2, 16, 2) and mask.sum(1).tolist() == [3, 9]
    assert steps[0, 3:].abs().sum() == 0 and steps[1, 8].tolist() == [2.0, 2.0]


def test_unequal_workers_take_equal_steps_and_a_gru_learns_with_validation_and_waste():
    x, y = token_task(300)
    shards = [Shard(x[:200], y[:200]), Shard(x[200:], y[200:])]  # two workers of unequal sizes
    res = run_threads(spec(epochs=6, validationFraction=0.2), shards)
    assert res[0].info["steps"] == res[1].info["steps"] > 0
    hist = res[0].history
    assert hist[-1]["accuracy"] > 0.75 and hist[-1]["loss"] < hist[0]["loss"]
    assert all(1.0 <= h["paddingWaste"] < 1.6 for h in hist)


def test_one_seed_reproduces_a_run_exactly():
    x, y = token_task(120)
    a, b = (run_threads(spec(epochs=2), shard_rows(x, y, 2))[0].state for _ in range(2))
    assert a == b


def test_resume_from_an_epoch_checkpoint_equals_the_uninterrupted_run(tmp_path):
    x, y = token_task(120)
    ref = run_threads(spec(epochs=3), shard_rows(x, y, 2))[0].state
    run_threads(spec(epochs=1, checkpointDir=str(tmp_path)), shard_rows(x, y, 2))
    res = run_threads(spec(epochs=3, checkpointDir=str(tmp_path)), shard_rows(x, y, 2))
    assert res[0].resumed_from is not None and len(res[0].history) == 3
    a, b = (torch.load(io.BytesIO(s), weights_only=True) for s in (ref, res[0].state))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_a_network_that_does_not_take_its_declared_input_is_named_before_the_first_step():
    x, y = token_task(40)
    # a network over one tensor of ids, without input_kind: it is given ids and a mask
    net = network_spec(lambda: torch.nn.Sequential(torch.nn.Embedding(20, 4), torch.nn.Linear(4, 2)))
    with pytest.raises(ValueError, match="input_kind 'padded'.*module\\(ids, mask\\)"):
        run_threads(spec(network=net), shard_rows(x, y, 1))


def test_batchnorm_statistics_are_recomputed_over_length_batches():
    class Normed(torch.nn.Module):
        input_kind = "padded"

        def __init__(self):
            super().__init__()
            self.embed, self.norm, self.head = torch.nn.Embedding(20, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)

        def forward(self, ids, mask):
            m = mask.unsqueeze(-1).float()
            return self.head(self.norm((self.embed(ids) * m).sum(1) / m.sum(1)))

    x, y = token_task(80)
    res = run_threads(spec(network=network_spec(Normed), epochs=1), shard_rows(x, y, 2))
    state = torch.load(io.BytesIO(res[0].state), weights_only=True)
    assert int(state["norm.num_batches_tracked"]) > 0 and not torch.equal(state["norm.running_mean"],
                                                                          torch.zeros(8))


def test_null_and_empty_rows_are_named_or_skipped_and_counted():
    x, y = token_task(60)
    x[3], x[10] = None, np.zeros(0, np.int64)
    with pytest.raises(ValueError, match="null sequence at row 3.*2 such rows.*nanPolicy"):
        run_threads(spec(epochs=1), shard_rows(x, y, 1))
    res = run_threads(spec(epochs=1, nanPolicy="skip"), shard_rows(x, y, 1))
    assert res[0].history[-1]["skippedRows"] == 2


def test_batch_size_auto_refuses_variable_length_rows():
    x, y = token_task(40)
    with pytest.raises(ValueError, match="batchSize='auto'.*tokenBudget"):
        run_threads(spec(auto_batch=AutoBatch()), shard_rows(x, y, 1))


def token_batches(x, y, per=50):
    for s in range(0, len(y), per):
        rows = [None if r is None else r.tolist() for r in x[s:s + per]]
        yield pa.RecordBatch.from_arrays([pa.array(rows, pa.list_(pa.int64())),
                                          pa.array(y[s:s + per], pa.float64())], [FEATURES, LABEL])


def test_token_ids_within_the_buffer_are_a_ragged_shard_and_past_it_spill_with_their_offsets():
    x, y = token_task(300)
    held, profile = read_partition(token_batches(x, y), InputFormat("sequence"), 1000)
    assert isinstance(held, Shard) and held.x.dtype == object and np.array_equal(held.x[17], x[17])
    assert (profile[3], profile[4]) == (min(map(len, x)), max(map(len, x)))
    spilled, _ = read_partition(token_batches(x, y), InputFormat("sequence"), 64)
    try:
        assert isinstance(spilled, SpilledShard) and np.array_equal(spilled.lengths, [len(r) for r in x])
        rows, _, _ = spilled.split(0.0, 0, "error")
        rows.use_lengths("padded", 256, 16)
        count = rows.batch_count(3, 0, 1)
        order = list(rows.order(16, count, 3, 0, 1))
        assert sorted(np.concatenate(order).tolist()) == list(range(300))  # every row once per epoch
        assert all(len(b) <= 16 and (len(b) == 1 or len(b) * padded_length(spilled.lengths[b]) <= 256)
                   for b in order)
        assert [b.tolist() for b in order] != [b.tolist() for b in rows.order(16, count, 3, 0, 2)]
        (ids, mask), yb = next(rows.batches(BatchPlan(16, count, 3, 0, 1), augment=False))
        first = order[0]
        assert ids.shape[0] == len(first) and mask[0].sum() == len(x[first[0]])
        assert ids[0, :len(x[first[0]])].tolist() == x[first[0]].tolist() and yb.tolist() == y[first].tolist()
    finally:
        spilled.close()


def test_a_streamed_gru_learns_from_token_ids_past_the_buffer():
    x, y = token_task(300)
    fmt = InputFormat("sequence")
    shards = [read_partition(token_batches(x[r::2], y[r::2]), fmt, 64)[0] for r in range(2)]
    try:
        res = run_threads(spec(epochs=6, input_format=fmt, shuffleBuffer=64, validationFraction=0.2),
                          shards)
    finally:
        for s in shards:
            s.close()
    assert res[0].info["steps"] == res[1].info["steps"]
    assert res[0].history[-1]["accuracy"] > 0.75 and 1.0 <= res[0].history[-1]["paddingWaste"] < 1.6


def test_a_worker_streaming_8x_more_token_ids_keeps_its_peak_memory():
    """Peak RSS of a worker reading and iterating 10,000 and 80,000 rows of 50-500 token ids (about 22 MB and
    176 MB), with a 2,000-row buffer, in length batches."""
    script = textwrap.dedent("""
        import resource, sys, numpy as np, pyarrow as pa
        from irbis.train.rows import BatchPlan
        from irbis.train.stream import FEATURES, LABEL, InputFormat, read_partition
        rows = int(sys.argv[1])
        def gen():
            for s in range(0, rows, 500):
                rng = np.random.default_rng(s)
                lens = rng.integers(50, 501, 500)
                offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
                ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(1, 30000, lens.sum())))
                yield pa.RecordBatch.from_arrays([ids, pa.array(np.zeros(500))], [FEATURES, LABEL])
        shard, _ = read_partition(gen(), InputFormat("sequence"), 2000)
        train, _, _ = shard.split(0.0, 0, "error")
        train.use_lengths("padded", 8192, 64)
        seen = 0
        for epoch in range(2):
            count = train.batch_count(0, 0, epoch)
            for (ids, mask), yb in train.batches(BatchPlan(64, count, 0, 0, epoch), augment=False):
                seen += len(yb)
        shard.close()
        print(seen, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    peaks = peak_rss_mib(script, (10_000, 80_000))
    print("peak RSS MiB:", json.dumps(peaks))
    assert peaks[80_000] < 1.25 * peaks[10_000], peaks


def token_dropout(rows, rng):
    """Drop each token but the first with probability 0.2 (a text augmentation): rows get shorter."""
    return [np.concatenate([r[:1], r[1:][rng.random(len(r) - 1) >= 0.2]]) for r in rows]


def test_augment_gets_each_batch_s_rows_before_padding_and_may_shorten_them():
    x, y = token_task(120)
    seen = []

    def watched(rows, rng):
        assert rows.dtype == object and all(r.dtype == np.int64 and r.ndim == 1 for r in rows)
        out = token_dropout(rows, rng)
        seen.append((sum(map(len, rows)), sum(map(len, out))))
        return out

    res = run_threads(spec(epochs=2, augment=watched), shard_rows(x, y, 1))
    assert len(seen) == res[0].info["steps"] and all(after < before for before, after in seen)
    again = run_threads(spec(epochs=2, augment=token_dropout), shard_rows(x, y, 1))
    assert again[0].state == run_threads(spec(epochs=2, augment=token_dropout), shard_rows(x, y, 1))[0].state
    assert again[0].state != run_threads(spec(epochs=2), shard_rows(x, y, 1))[0].state


def test_augment_that_breaks_the_rows_is_named(tmp_path):
    x, y = token_task(40)
    with pytest.raises(ValueError, match="returned 1 rows for a batch of"):
        run_threads(spec(augment=lambda rows, rng: rows[:1]), shard_rows(x, y, 1))
    with pytest.raises(ValueError, match="row 0 as float64.*integer token ids"):
        run_threads(spec(augment=lambda rows, rng: [r.astype(float) for r in rows]), shard_rows(x, y, 1))


def test_augment_reaches_rows_streamed_from_the_spill(tmp_path):
    x, y = token_task(200)
    ids = pa.array([r.tolist() for r in x], pa.list_(pa.int32()))
    batch = pa.RecordBatch.from_pydict({FEATURES: ids, LABEL: pa.array(y.astype(np.float64))})
    shard, _ = read_partition(iter([batch]), InputFormat("sequence"), buffer_rows=40, spill_dir=str(tmp_path))
    assert isinstance(shard, SpilledShard)
    lengths = []

    def watched(rows, rng):
        out = token_dropout(rows, rng)
        lengths.append((sum(map(len, rows)), sum(map(len, out))))
        return out

    res = run_threads(spec(epochs=1, augment=watched, input_format=InputFormat("sequence")), [shard])
    assert len(lengths) == res[0].info["steps"] > 0 and all(after < before for before, after in lengths)


def test_batches_are_cut_afresh_each_epoch_and_spread_copies_of_one_text():
    """Data repeated 8x: cut from one sort of the whole shard, a batch of 8 holds the copies of one or two
    texts side by side, and the same batches every epoch. Cut from random chunks, a batch mostly holds
    distinct texts, and its neighbours change with the epoch."""
    rng = np.random.default_rng(0)
    base = rows_of(np.minimum(rng.lognormal(4.5, 0.6, 300).astype(int) + 1, 256))
    rows = RaggedRows(np.concatenate([base] * 8), np.zeros(2400), "padded", 4096, 8)

    def distinct(batches):
        return np.mean([len(set((b % 300).tolist())) / len(b) for b in batches])

    whole = length_batches(rows.lengths, token_budget=4096, max_rows=8)
    assert distinct(rows.plan(0, 0, 0)) > 0.6 > 0.5 > distinct(whole)
    first = {frozenset(b.tolist()) for b in rows.plan(0, 0, 0)}
    assert len(first & {frozenset(b.tolist()) for b in rows.plan(0, 0, 1)}) < 0.05 * len(first)
    # the padding stays as low as one sort's
    waste = sum(len(b) * padded_length(rows.lengths[b]) for b in rows.plan(0, 0, 0)) / rows.lengths.sum()
    assert waste < 1.10


@pytest.mark.parametrize(("precision", "device", "kind", "autocast"), [
    ("bf16", "cpu", "sequence", "cpu"), ("fp32", "cpu", "sequence", None), ("auto", "cpu", "image", None),
    ("auto", "cuda", "image", "cuda"), ("auto", "cuda", "sequence", None), ("fp32", "cuda", "image", None)])
@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_training_precision_sets_the_steps_autocast(precision, device, kind, autocast):
    s = spec(trainingPrecision=precision, device=device, input_format=InputFormat(kind=kind))
    ctx = step_autocast(s)
    assert (getattr(ctx, "device", None), getattr(ctx, "fast_dtype", None)) == (
        (autocast, torch.bfloat16) if autocast else (None, None))
    if device == "cpu":
        with ctx:
            out = torch.nn.Linear(4, 2)(torch.ones(1, 4))
        assert out.dtype == (torch.bfloat16 if autocast else torch.float32)


def test_a_gru_learns_in_bf16_with_its_weights_and_exchange_in_fp32():
    x, y = token_task(300)
    shards = [Shard(x[:200], y[:200]), Shard(x[200:], y[200:])]
    fp32, bf16 = (run_threads(spec(epochs=6, validationFraction=0.2, trainingPrecision=p), shards)
                  for p in ("fp32", "bf16"))
    assert bf16[0].history[-1]["accuracy"] > 0.75 and bf16[0].history[-1]["loss"] < bf16[0].history[0]["loss"]
    a, b = (torch.load(io.BytesIO(r[0].state), weights_only=True) for r in (fp32, bf16))
    assert all(t.dtype == torch.float32 for t in b.values())  # the weights stay fp32
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the steps ran in bf16: other weights than fp32's
    assert bf16[0].history[-1]["bytesPerStep"] == fp32[0].history[-1]["bytesPerStep"]  # fp32 gradients sent


def test_bf16_on_a_cpu_without_bf16_instructions_warns_in_the_summary(monkeypatch):
    x, y = token_task(60)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    hist = run_threads(spec(epochs=2, trainingPrecision="bf16"), shard_rows(x, y, 2))[0].history
    assert "without bf16 instructions" in hist[0]["warning"] and "warning" not in hist[1]
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert "warning" not in run_threads(spec(epochs=1, trainingPrecision="bf16"), shard_rows(x, y, 2))[0].history[0]
