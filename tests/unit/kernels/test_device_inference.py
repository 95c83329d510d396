"""The inference kernel on the run's device (``pytest --device cuda``; the CPU by default): the answers of the
plain module on the CPU, and the network really on that device. No pyspark here: these run on the lent GPU
machine, which has no Spark (``make gpu-check``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from irbis.kernels.inference import cached_networks, clear_cache, make_torch_predict_fn
from irbis.models import build_model

#: How far the device's fp32 outputs may be from the CPU's: cuDNN runs fp32 convolutions in TF32 by default.
TOLERANCE = {"cpu": 1e-3, "cuda": 1e-2}


@pytest.fixture
def bundle(tmp_path):
    """A model folder: the small CIFAR CNN (conv, batch norm, pooling, linear) with seeded random weights."""
    options = {"num_classes": 5, "width": 8, "seed": 3}
    clear_cache()  # the process's cache holds only this network (earlier tests may have left theirs)
    (tmp_path / "architecture.json").write_text(json.dumps({"architecture": "small_cnn", "options": options}))
    torch.save(build_model("small_cnn", **options).state_dict(), tmp_path / "weights.pt")
    yield {"kind": "bundle", "path": str(tmp_path)}
    clear_cache()


def inputs(n: int = 24) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, 3, 32, 32)).astype(np.float32)


def reference(x: np.ndarray) -> np.ndarray:
    """The plain module's fp32 answers on the CPU."""
    with torch.inference_mode():
        return build_model("small_cnn", num_classes=5, width=8, seed=3)(torch.from_numpy(x)).numpy()


def devices_run_on(module: torch.nn.Module, x: np.ndarray, fn) -> set[str]:
    """The devices of the network's outputs while ``fn`` scores ``x``."""
    seen: set[str] = set()
    handle = module.register_forward_hook(lambda _m, _i, out: seen.add(out.device.type))
    try:
        fn(x)
    finally:
        handle.remove()
    return seen


def test_fp32_kernel_on_the_device_gives_the_cpu_answers(bundle, device):
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    x = inputs()
    fn = make_torch_predict_fn(bundle, device=device, batch_size=8, engine="torch")
    got = fn(x)
    assert got.shape == (24, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference(x), rtol=TOLERANCE[device], atol=TOLERANCE[device])
    (network,) = cached_networks()
    assert {p.device.type for p in network.parameters()} == {device}
    assert devices_run_on(network, x[:4], fn) == {device}
    if device == "cuda":
        assert torch.cuda.max_memory_allocated() > 0


def test_bf16_kernel_on_the_device_keeps_the_top_class(bundle, device):
    x = inputs(64)
    got = make_torch_predict_fn(bundle, device=device, precision="bf16", batch_size=16, engine="torch")(x)
    want = reference(x)
    assert got.dtype == np.float32
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.9
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
    (network,) = cached_networks()
    assert {p.device.type for p in network.parameters()} == {device}


def inner_reference(x: np.ndarray) -> dict[str, np.ndarray]:
    """The plain module's inner outputs on the CPU, each layer called by hand in order (no hooks, contiguous
    NCHW tensors), flattened per row in the logical (C, H, W) order."""
    module = build_model("small_cnn", num_classes=5, width=8, seed=3)
    with torch.inference_mode():
        features = module.features(torch.from_numpy(x))
        pool = module.pool(features)
        classifier = module.classifier(module.flatten(pool))
    return {name: t.reshape(len(x), -1).numpy() for name, t in
            (("features", features), ("pool", pool), ("classifier", classifier))}


def test_inner_layers_on_the_device_match_the_plain_module(bundle, device):
    """Inner layers of one forward pass on the run's device (channels-last batches) against the plain module's
    layers called one by one on the CPU: an independent reference, so on the CPU too (``pytest --device cpu``)
    a hook that takes the wrong tensor, or a channels-last activation flattened in its memory order, fails."""
    x = inputs(8)
    layers = ("features", "pool", "classifier")
    got = make_torch_predict_fn(bundle, output_layer=layers, device=device, engine="torch")(x)
    assert {name: got[name].shape for name in layers} == {"features": (8, 512), "pool": (8, 32), "classifier": (8, 5)}
    want = inner_reference(x)
    for name in layers:
        np.testing.assert_allclose(got[name], want[name], rtol=TOLERANCE[device], atol=TOLERANCE[device])
    (network,) = cached_networks()
    assert {p.device.type for p in network.parameters()} == {device}
