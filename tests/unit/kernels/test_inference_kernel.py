"""The inference kernel without Spark: equality with plain PyTorch, inner layers, precision, safety."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from irbis.kernels.batching import network_batch
from irbis.kernels.blocks import from_rows, rows_in
from irbis.kernels.inference import cached_networks, clear_cache, make_torch_predict_fn, resolve_source
from irbis.models import build_model


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle")
    options = {"in_features": 64, "hidden": 32, "out_features": 10}
    net = build_model("mlp", **options)
    (folder / "architecture.json").write_text(json.dumps({"architecture": "mlp", "options": options}))
    torch.save(net.state_dict(), folder / "weights.pt")
    return folder, net


def _digits(n=20):
    from sklearn.datasets import load_digits

    return (load_digits().data[:n] / 16.0).astype(np.float32)


def test_predict_fn_equals_plain_torch(mlp_bundle):
    folder, net = mlp_bundle
    x = _digits()
    fn = make_torch_predict_fn(resolve_source(str(folder)), batch_size=7)
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(fn(x), expected, rtol=1e-5, atol=1e-5)


def test_output_layer_equals_forward_hook(mlp_bundle):
    folder, net = mlp_bundle
    layer = [name for name, _ in net.named_modules() if name][1]
    seen = []
    handle = dict(net.named_modules())[layer].register_forward_hook(lambda m, i, o: seen.append(o))
    x = _digits()
    with torch.no_grad():
        net(torch.from_numpy(x))
    handle.remove()
    fn = make_torch_predict_fn(resolve_source(str(folder)), output_layer=layer)
    np.testing.assert_allclose(fn(x), seen[0].reshape(len(x), -1).numpy(), rtol=1e-5, atol=1e-5)


def _layer_outputs(net, x):
    """Every module's output for ``x``, recorded by hooks removed afterwards."""
    seen, handles = {}, []
    for name, module in net.named_modules():
        if name:
            handles.append(module.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o)))
    with torch.no_grad():
        final = net(torch.from_numpy(x))
    for h in handles:
        h.remove()
    return {name: out.reshape(len(x), -1).numpy() for name, out in seen.items()}, final.numpy()


@pytest.mark.parametrize("order", [("0", "1", ""), ("", "1", "0")])
def test_stages_cutting_one_cached_network_at_different_layers_leave_it_untouched(mlp_bundle, order):
    """Cuts at different layers share one cached network, in either order, and leave no hook on it."""
    folder, net = mlp_bundle
    clear_cache()
    x = _digits()
    layers, final = _layer_outputs(net, x)
    source = resolve_source(str(folder))
    fns = {layer: make_torch_predict_fn(source, output_layer=layer or None) for layer in order}
    for _ in range(2):
        for layer in order:
            expected = layers[layer] if layer else final
            np.testing.assert_allclose(fns[layer](x), expected, rtol=1e-5, atol=1e-5)
    (cached,) = cached_networks()  # one network for every layer
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in cached.modules())
    assert all("forward" not in vars(m) for m in cached.modules())


def test_unknown_output_layer_lists_modules(mlp_bundle):
    folder, _ = mlp_bundle
    with pytest.raises(ValueError, match="outputLayer 'nope'"):
        make_torch_predict_fn(resolve_source(str(folder)), output_layer="nope")


@pytest.mark.parametrize("precision,tol", [("bf16", 0.05), ("int8", 0.05)])
def test_reduced_precision_stays_close(mlp_bundle, precision, tol):
    folder, net = mlp_bundle
    x = _digits(50)
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    got = make_torch_predict_fn(resolve_source(str(folder)), precision=precision)(x)
    assert np.abs(got - expected).max() < tol * np.abs(expected).max() + tol
    assert (got.argmax(1) == expected.argmax(1)).mean() >= 0.9


def test_weights_are_memory_mapped_from_one_shared_file(mlp_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path))
    clear_cache()
    folder, _ = mlp_bundle
    make_torch_predict_fn(resolve_source(str(folder)), precision="fp32")(_digits(2))
    prepared = list((tmp_path / "models" / "prepared").glob("*.pt"))
    assert len(prepared) == 1
    with open("/proc/self/maps") as maps:
        assert str(prepared[0]) in maps.read()


def test_pickled_module_is_refused_unless_allowed(tmp_path):
    folder = tmp_path / "net"
    folder.mkdir()
    (folder / "architecture.json").write_text(json.dumps({"architecture": "mlp", "options": {
        "in_features": 4, "hidden": 3, "out_features": 2}}))
    net = build_model("mlp", in_features=4, hidden=3, out_features=2)
    torch.save(net, folder / "weights.pt", pickle_protocol=pickle.HIGHEST_PROTOCOL)  # a whole pickled module
    with pytest.raises(ValueError, match="(?i)pickl"):
        make_torch_predict_fn(resolve_source(str(folder)))(np.zeros((1, 4), np.float32))
    out = make_torch_predict_fn(resolve_source(str(folder)), allow_pickle=True)(np.zeros((1, 4), np.float32))
    assert out.shape == (1, 2)


def test_missing_model_names_the_path():
    with pytest.raises(FileNotFoundError, match="no-such-model.pt"):
        resolve_source("/tmp/irbis-tests/no-such-model.pt")


def test_network_batch_nulls_shapes_and_images():
    rows = [np.arange(4, dtype=np.float32), None, np.ones(4)]
    batch = network_batch(rows_in(rows, "x"), "x", [1, 2, 2])
    assert batch.values.shape == (2, 1, 2, 2) and batch.valid.tolist() == [True, False, True]
    assert batch.values.dtype == np.float32
    assert [r is None for r in from_rows(batch.values.reshape(2, -1), batch.valid)] == [False, True, False]
    with pytest.raises(ValueError, match=r"column 'x'.*shape \[3\].*expects shape \[1, 2, 2\]"):
        network_batch(rows_in([np.ones(3)], "x"), "x", [1, 2, 2])
    nested = np.array([np.array([1.0, 2.0]), np.array([3.0, 4.0])], dtype=object)
    assert network_batch(rows_in([nested], "n"), "n").values.shape == (1, 2, 2)
    image = {"height": 2, "width": 3, "nChannels": 3, "data": bytes(range(18)), "mode": 16, "origin": ""}
    chw = network_batch(rows_in([image], "image"), "image").values
    assert chw.shape == (1, 3, 2, 3) and chw[0, 1, 0, 0] == 1.0


def test_stale_prepared_weights_are_replaced(tmp_path):
    from irbis.kernels.inference import share_weights

    net = build_model("mlp", in_features=4, hidden=3, out_features=2)
    stale = {k: v.to(torch.bfloat16) for k, v in net.state_dict().items()}
    (tmp_path / "prepared").mkdir()
    torch.save(stale, tmp_path / "prepared" / "k.pt")
    shared = share_weights(net, "k", cache_dir=tmp_path)
    assert all(t.dtype == torch.float32 for t in shared.state_dict().values())
    assert torch.load(tmp_path / "prepared" / "k.pt", weights_only=True)["1.weight"].dtype == torch.float32


def test_bf16_keeps_first_and_last_layer_in_fp32(mlp_bundle):
    folder, net = mlp_bundle
    x = _digits(30)
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    got = make_torch_predict_fn(resolve_source(str(folder)), precision="bf16")(x)
    # With only the middle layers in bf16 the logits stay within bf16 rounding of fp32.
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()
    assert (got.argmax(1) == expected.argmax(1)).all()


def test_the_network_kernel_is_a_value_that_names_its_files_and_reads_them_where_they_land(mlp_bundle, tmp_path):
    import pickle
    import shutil

    from irbis.kernels.blocks import Tensor
    from irbis.kernels.inference import NetworkKernel

    folder, net = mlp_bundle
    kernel = NetworkKernel(resolve_source(str(folder)), "x", "y", {"engine": "torch"}, error_col="why", shape=[64])
    assert kernel.files == (str(folder),)
    assert NetworkKernel({"kind": "repository", "name": "mlp"}, "x", "y", {}).files == ()
    landed = shutil.copytree(folder, tmp_path / "landed")
    moved = pickle.loads(pickle.dumps(kernel)).relocated({str(folder): str(landed)})
    assert moved.files == (str(landed),)
    x = _digits(3)
    out = moved({"x": Tensor(x[:2], np.array([True, True, False]))})
    assert out["y"].valid.tolist() == [True, True, False] and out["why"].tolist() == [None, None, "null row"]
    with torch.no_grad():
        np.testing.assert_allclose(out["y"].values[:2], net.eval()(torch.from_numpy(x[:2])).numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_the_image_kernel_names_its_network_file_and_its_classifier_head_is_a_softmax(tmp_path):
    from irbis.kernels.blocks import Tensor
    from irbis.kernels.inference import ImageKernel, class_outputs

    kernel = ImageKernel({"kind": "file", "path": "/fitted/net.pt2"}, "image", None, (("", "raw"),), {})
    assert kernel.files == ("/fitted/net.pt2",)
    landed = str(tmp_path / "net.pt2")
    assert kernel.relocated({"/fitted/net.pt2": landed}).source["path"] == landed
    assert ImageKernel({"kind": "repository", "name": "efficientnet_lite0"}, "image", None, (), {}).files == ()
    logits = np.array([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]], np.float32)  # rows 0 and 2; row 1 has no output
    out = class_outputs(Tensor(logits, np.array([True, False, True])), "probability", "prediction")
    expected = torch.softmax(torch.from_numpy(logits), 1).numpy()
    np.testing.assert_allclose(out["probability"].values, expected, rtol=1e-6)
    assert out["prediction"] == [1.0, None, 2.0]


def test_a_networks_identity_is_its_files_content_not_their_path(mlp_bundle, tmp_path):
    """The ONNX exports are keyed by source_identity: the same files copied elsewhere (a stage saved and
    loaded again) keep the key, so the machine's export serves them; changed weights, a renamed file or
    another kind of source change it."""
    import shutil

    from irbis.kernels.inference import process_key, source_identity

    folder, net = mlp_bundle
    copy = shutil.copytree(folder, tmp_path / "saved" / "network")
    same = source_identity({"kind": "bundle", "path": str(folder)})
    assert source_identity({"kind": "bundle", "path": str(copy)}) == same
    assert source_identity({"kind": "exported", "path": str(copy)}) != same
    assert process_key({"kind": "bundle", "path": str(copy)}) != process_key({"kind": "bundle", "path": str(folder)})
    torch.save({k: v + 1 for k, v in net.state_dict().items()}, copy / "weights.pt")
    changed = source_identity({"kind": "bundle", "path": str(copy)})
    assert changed != same
    (copy / "weights.pt").rename(copy / "other.pt")
    assert source_identity({"kind": "bundle", "path": str(copy)}) not in (same, changed)
    single = tmp_path / "a.pt2"
    single.write_bytes(b"weights")
    (tmp_path / "b").mkdir()
    shutil.copy(single, tmp_path / "b" / "a.pt2")
    assert source_identity({"kind": "exported", "path": str(single)}) == source_identity(
        {"kind": "exported", "path": str(tmp_path / "b" / "a.pt2")})
