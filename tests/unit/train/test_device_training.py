"""The training loop on the run's device (``pytest --device cuda``; the CPU by default), through the thread
backend: numbers and encoded images (the GPU's image path: bf16 autocast on channels-last batches through
pinned memory). No pyspark here: these run on the lent GPU machine, which has no Spark (``make gpu-check``)."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pyarrow as pa
import pytest
import torch
from train_helpers import token_task

from irbis.train.backends.local import run_threads
from irbis.train.data import Shard
from irbis.train.loop import TrainSpec, gpu_images
from irbis.train.networks import network_spec
from irbis.train.stream import FEATURES, LABEL, InputFormat, read_partition


def final_weights(result) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(result.state), weights_only=True, map_location="cpu")


def test_vector_training_on_the_device_follows_the_cpu(device):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = (x[:, 1] > 0).astype(np.int64)
    results = {}
    for where in {"cpu", device}:
        spec = TrainSpec(network=network_spec("mlp", {"in_features": 8, "hidden": 16, "out_features": 2}),
                         epochs=6, batch_size=32, optimizer="sgd", learning_rate=0.2, device=where)
        (results[where],) = run_threads(spec, [Shard(x, y)])
    losses = [r["loss"] for r in results[device].history]
    assert len(losses) == 6 and np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0]
    want, got = final_weights(results["cpu"]), final_weights(results[device])
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=1e-3)


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
    spec = TrainSpec(network=network_spec("small_cnn", {"num_classes": 2, "width": 8}), epochs=5, batch_size=16,
                     learning_rate=3e-3, device=device, input_shape=[3, 32, 32], input_format=fmt,
                     recompute_batchnorm="never")
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
    spec = TrainSpec(network=network_spec("mlp", {"in_features": 4, "hidden": 8, "out_features": 2}), epochs=3,
                     batch_size=16, optimizer="sgd", learning_rate=0.1, device=device)
    results = run_threads(spec, [Shard(x[:64], y[:64]), Shard(x[64:], y[64:])])
    assert [r.rank for r in results] == [0, 1] and results[0].state is not None
    assert np.isfinite([r["loss"] for r in results[0].history]).all()


@pytest.mark.parametrize("architecture", ["lstm_classifier", "gru_classifier"])  # packed, padded
def test_variable_length_rows_train_on_the_device(device, architecture):
    """Token-id rows of varying length, in length batches: a PackedSequence (its lengths stay on the host, as
    torch requires) or padded ids with a mask, on the run's device; the loss follows the CPU's."""
    x, y = token_task(240)
    net = network_spec(architecture, {"vocab_size": 20, "embed": 8, "hidden": 16})
    histories = {}
    for where in {"cpu", device}:
        spec = TrainSpec(network=net, epochs=4, batch_size=16, learning_rate=1e-2, token_budget=512, device=where,
                         torch_threads=1)
        (result,) = run_threads(spec, [Shard(x, y)])
        histories[where] = [r["loss"] for r in result.history]
        assert all(t.device.type == "cpu" for t in final_weights(result).values())
    losses = histories[device]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert np.allclose(losses, histories["cpu"], rtol=0.05, atol=0.02)  # cuDNN's recurrences round differently
