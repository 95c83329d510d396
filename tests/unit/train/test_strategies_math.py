"""Pure math of the strategies, and each one's degenerate case against plain SGD."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from irbis.train.strategies import BlockMomentum, ModelAveraging, OneBitSGD, SyncSGD
from irbis.train.strategies.block_momentum import State as BmufState
from irbis.train.strategies.block_momentum import bmuf_update
from irbis.train.strategies.one_bit_sgd import (
    column_ids,
    decode,
    dequantize,
    encode,
    pack_bits,
    packet_bytes,
    quantize,
    unpack_bits,
)
from train_helpers import plain_sgd, run_workers, weights


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=4), st.integers(1, 64), st.integers(0, 10_000))
def test_one_bit_quantisation_keeps_column_mass(sizes, column_size, seed):
    c = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    cols, ncols = column_ids(sizes, column_size)
    bits, pos, neg = quantize(c, cols, ncols)
    q = dequantize(bits, pos, neg, cols)
    e = c - q
    col_mass = torch.zeros(ncols, dtype=c.dtype).index_add(0, cols, e)
    assert torch.allclose(col_mass, torch.zeros_like(col_mass), atol=1e-9)
    assert torch.equal(torch.sign(q[c != 0]), torch.sign(c[c != 0]))


def test_columns_never_span_two_tensors():
    cols, ncols = column_ids([5, 3], 4)
    assert cols.tolist() == [0, 0, 0, 0, 1, 2, 2, 2] and ncols == 3


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=200))
def test_pack_bits_matches_numpy(bits):
    b = torch.tensor(bits)
    packed = pack_bits(b)
    assert packed.tolist() == np.packbits(np.array(bits)).tolist()
    assert torch.equal(unpack_bits(packed, len(bits)), b)


def test_packet_round_trip_and_size():
    c = torch.randn(9610)
    cols, ncols = column_ids([8192, 128, 1280, 10], 512)
    packet, q = encode(c, cols, ncols)
    assert packet.dtype == torch.uint8 and packet.numel() == packet_bytes(9610, ncols)
    assert torch.equal(decode(packet, 9610, cols, ncols, torch.float32), q)
    assert 9610 * 4 / packet.numel() >= 25


def test_error_feedback_delivers_the_gradient_sum_over_time():
    """Sum of transmitted q over T steps = sum of gradients minus the final residual (nothing is lost)."""
    g = torch.Generator().manual_seed(0)
    cols, ncols = column_ids([200], 16)
    e, sent, total = torch.zeros(200, dtype=torch.float64), 0, 0
    for _ in range(50):
        grad = torch.randn(200, generator=g, dtype=torch.float64)
        c = grad + e
        _, q = encode(c, cols, ncols)
        e = c - q
        sent, total = sent + q, total + grad
    assert torch.allclose(sent + e, total)
    assert e.abs().max() < total.abs().max()


def test_bmuf_with_zero_momentum_and_unit_rate_is_averaging():
    w = torch.tensor([1.0, 2.0])
    s = BmufState(w.clone(), torch.zeros(2), w.clone())
    avg = torch.tensor([3.0, 0.0])
    out = bmuf_update(avg, s, eta=0.0, zeta=1.0, nesterov=False)
    assert torch.equal(out, avg) and torch.equal(s.global_weights, avg)


def test_bmuf_momentum_and_nesterov_hand_out():
    s = BmufState(torch.zeros(1), torch.ones(1), torch.zeros(1))
    out = bmuf_update(torch.tensor([2.0]), s, eta=0.5, zeta=1.0, nesterov=True)
    # delta = 0.5*1 + 2 = 2.5 ; W = 2.5 ; hand out W + 0.5*delta = 3.75 ; next G is measured from there
    assert float(s.delta) == 2.5 and float(s.global_weights) == 2.5 and float(out) == 3.75
    assert float(s.init_weights) == 3.75


@pytest.mark.parametrize("make", [SyncSGD, lambda: ModelAveraging(period=3), lambda: BlockMomentum(blockSize=3),
                                  lambda: OneBitSGD(warmupSteps=10**6)])
def test_single_worker_equals_plain_sgd(make):
    (model, _), = run_workers(1, make, steps=12)
    assert torch.allclose(weights(model), weights(plain_sgd(12)), atol=1e-6)


@pytest.mark.parametrize("opt", [lambda p: torch.optim.SGD(p, lr=0.1), lambda p: torch.optim.Adam(p, lr=0.01)],
                         ids=["sgd", "adam"])
def test_sync_sgd_two_halves_equal_one_full_batch(opt):
    """2 workers x batch 4 on interleaved rows == 1 process x batch 8 on the same rows (same order).

    Plain SGD's step is proportional to the gradient, so it tells the workers' mean from their sum (a sum
    would be a step twice as long); Adam divides the gradient's scale out and cannot, so its case checks the
    optimizer's path (its state taken on the averaged gradient) only."""
    out = run_workers(2, SyncSGD, steps=10, batch=4, opt=opt)
    from train_helpers import tiny_data, tiny_net

    x, y = tiny_data()
    ref = tiny_net(0)
    o = opt(ref.parameters())
    xs = [x[0::2], x[1::2]]
    ys = [y[0::2], y[1::2]]
    for s in range(10):
        i = (s * 4) % 32
        o.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref(xs[r][i:i + 4]), ys[r][i:i + 4]) for r in range(2)) / 2
        loss.backward()
        o.step()
    assert not torch.allclose(weights(ref), weights(tiny_net(0)), atol=1e-3)
    for model, _ in out:
        torch.testing.assert_close(weights(model), weights(ref), rtol=0, atol=1e-6)


@pytest.mark.parametrize("make", [SyncSGD, lambda: SyncSGD(backupWorkers=1), lambda: ModelAveraging(period=2),
                                  lambda: BlockMomentum(blockSize=2, nesterov=True), OneBitSGD])
def test_replicas_agree_and_learn(make):
    out = run_workers(3, make, steps=9)
    ws = [weights(m) for m, _ in out]
    for w in ws[1:]:
        assert torch.allclose(w, ws[0], atol=1e-6)
    from train_helpers import tiny_net

    assert not torch.allclose(ws[0], weights(tiny_net(0)))


def test_one_bit_bytes_per_step_are_measured():
    out_sync = run_workers(2, SyncSGD, steps=4)
    out_bit = run_workers(2, lambda: OneBitSGD(columnSize=512), steps=4)
    sync_b = out_sync[0][1].ctx.comm.bytes_sent
    bit_b = out_bit[0][1].ctx.comm.bytes_sent
    n = weights(out_sync[0][0]).numel()
    assert sync_b == 4 * n * 4 + n * 4  # 4 all-reduces + the initial broadcast from rank 0
    _, ncols = column_ids([p.numel() for p in out_bit[0][0].parameters()], 512)
    assert bit_b == 4 * packet_bytes(n, ncols) + n * 4
