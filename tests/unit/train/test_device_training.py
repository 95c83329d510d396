"""The training loop on the run's device (``pytest --device cuda``; the CPU by default), through the thread
backend: numbers and encoded images (the GPU's image path: bf16 autocast on channels-last batches through
pinned memory). No pyspark here: these run on the lent GPU machine, which has no Spark (``make gpu-check``)."""

from __future__ import annotations

import contextlib
import io

import cv2
import numpy as np
import pyarrow as pa
import pytest
import torch

from irbis.models import build_model
from irbis.train.backends.local import run_threads
from irbis.train.loop import TrainSpec, gpu_images
from irbis.train.networks import network_spec
from irbis.train.stream import FEATURES, LABEL, InputFormat, read_partition
from irbis.train.worker_data import Shard, epoch_batches
from train_helpers import token_task

#: How far the device's losses and weights may be from the eager CPU reference: cuDNN's recurrences and the
#: GPU's kernels sum in other orders than the CPU's; on the CPU only the batching of the sums differs.
TOLERANCE = {"cpu": 1e-4, "cuda": 2e-3}


@contextlib.contextmanager
def one_thread():
    """Torch's CPU operations on one thread while a reference runs (its operations are too small to gain from
    more, and lose much on a busy machine), then on as many as before."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def final_weights(result) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(result.state), weights_only=True, map_location="cpu")


def test_vector_training_on_the_device_follows_eager_torch_on_the_cpu(device):
    """The loop's weights and epoch losses on the run's device against plain SGD written out here in eager torch
    on the CPU, over the batches of the loop's seeded sampler (``epoch_batches``): an independent reference,
    so on the CPU too (``pytest --device cpu``) a step, loss or update the loop gets wrong fails this."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = (x[:, 1] > 0).astype(np.int64)
    options, epochs, batch, lr = {"in_features": 8, "hidden": 16, "out_features": 2}, 6, 32, 0.2
    spec = TrainSpec.of(network=network_spec("mlp", options), epochs=epochs, batchSize=batch, optimizer="sgd",
                        learningRate=lr, device=device)
    (result,) = run_threads(spec, [Shard(x, y)])
    ref = build_model("mlp", **options)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    xs, ys, want_losses = torch.from_numpy(x), torch.from_numpy(y), []
    with one_thread():
        for epoch in range(epochs):
            total = 0.0
            for ids in epoch_batches(len(x), batch, len(x) // batch, spec.data.seed, 0, epoch):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(ref(xs[ids]), ys[ids])
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(ids)
            want_losses.append(total / len(x))
    losses = [r["loss"] for r in result.history]
    assert len(losses) == epochs and losses[-1] < 0.5 * losses[0]
    np.testing.assert_allclose(losses, want_losses, rtol=TOLERANCE[device], atol=TOLERANCE[device])
    got = final_weights(result)
    for name, want in ref.state_dict().items():
        torch.testing.assert_close(got[name], want, rtol=TOLERANCE[device], atol=TOLERANCE[device])


def encoded_images(n: int, size: int = 40) -> tuple[list[bytes], np.ndarray]:
    """JPEG files of noisy images whose label is the stronger colour: red (0) or blue (1)."""
    rng = np.random.default_rng(1)
    files, labels = [], rng.integers(0, 2, n)
    for label in labels:
        rgb = rng.integers(0, 90, (size, size, 3)).astype(np.uint8)
        rgb[..., 2 * int(label)] += 150
        files.append(cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1].tobytes())
    return files, labels.astype(np.float64)


def test_image_training_on_the_device_takes_its_image_path_and_learns(device, tmp_path):
    files, labels = encoded_images(96)
    fmt = InputFormat("encoded", [3, 32, 32], preprocessing={"input_size": [32, 32], "mean": [127.0] * 3,
                                                              "std": [128.0] * 3})
    batch = pa.RecordBatch.from_pydict({FEATURES: pa.array(files, pa.binary()), LABEL: pa.array(labels)})
    shard, _ = read_partition(iter([batch]), fmt, buffer_rows=10_000, spill_dir=str(tmp_path))
    spec = TrainSpec.of(network=network_spec("small_cnn", {"num_classes": 2, "width": 8}), epochs=5, batchSize=16,
                        learningRate=3e-3, device=device, inputShape=[3, 32, 32], input_format=fmt,
                        recomputeBatchNorm="never")
    assert gpu_images(spec) == (device == "cuda")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    (result,) = run_threads(spec, [shard])
    losses = [r["loss"] for r in result.history]
    assert len(losses) == 5 and np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0]
    if device == "cuda":
        assert torch.cuda.max_memory_allocated() > 0
    assert all(t.dtype == torch.float32 for t in final_weights(result).values() if t.is_floating_point())


def test_two_thread_workers_share_the_device(device):
    """Two ranks of one process on the one device: the thread backend's collectives take its tensors."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(128, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 2] > 0).astype(np.int64)
    spec = TrainSpec.of(network=network_spec("mlp", {"in_features": 4, "hidden": 8, "out_features": 2}), epochs=3,
                        batchSize=16, optimizer="sgd", learningRate=0.1, device=device)
    results = run_threads(spec, [Shard(x[:64], y[:64]), Shard(x[64:], y[64:])])
    assert [r.rank for r in results] == [0, 1] and results[0].state is not None
    assert np.isfinite([r["loss"] for r in results[0].history]).all()


def by_itself(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """A recurrent classifier's logits for rows of one length ``(rows, length)``: no padding, mask or packing."""
    out, hidden = model.rnn(model.embed(ids))
    if isinstance(model.rnn, torch.nn.LSTM):
        return model.head(hidden[0][-1])  # the LSTM classifier: the last step's hidden state
    return model.head(out.mean(1))  # the GRU classifier: the mean of the steps' outputs


@pytest.mark.parametrize("architecture", ["lstm_classifier", "gru_classifier"])  # packed, padded
def test_variable_length_rows_train_on_the_device(device, architecture):
    """Token-id rows of 3 to 40 tokens in one length batch an epoch: a PackedSequence (its lengths stay on the
    host, as torch requires) or padded ids with a mask, on the run's device. The reference is eager torch on
    the CPU that runs the rows of each length apart (no padding, no packing) and steps plain SGD on their mean
    loss: on the CPU too (``pytest --device cpu``) a batch whose padding leaks into the result, or whose rows
    are packed with the wrong lengths, fails this."""
    x, y = token_task(80)
    options, epochs, lr = {"vocab_size": 20, "embed": 8, "hidden": 16}, 3, 1.0
    spec = TrainSpec.of(network=network_spec(architecture, options), epochs=epochs, batchSize=len(x), optimizer="sgd",
                        learningRate=lr, tokenBudget=len(x) * 40, device=device, torch_threads=1)
    (result,) = run_threads(spec, [Shard(x, y)])
    ref = build_model(architecture, **options)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    lengths = np.array([len(row) for row in x])
    groups = [np.flatnonzero(lengths == n) for n in np.unique(lengths)]
    rows = [torch.from_numpy(np.stack(list(x[g]))) for g in groups]
    labels, want_losses = torch.from_numpy(np.concatenate([y[g] for g in groups])), []
    with one_thread():
        for _ in range(epochs):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(torch.cat([by_itself(ref, r) for r in rows]), labels)
            loss.backward()
            opt.step()
            want_losses.append(float(loss.detach()))
    losses = [r["loss"] for r in result.history]
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, want_losses, rtol=TOLERANCE[device], atol=TOLERANCE[device])
    got = final_weights(result)
    assert all(t.device.type == "cpu" for t in got.values())
    for name, want in ref.state_dict().items():
        torch.testing.assert_close(got[name], want, rtol=TOLERANCE[device], atol=TOLERANCE[device])
