"""Inference engines without Spark: every engine equals eager fp32, whole and cut at inner layers."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from irbis.kernels.engines import ENGINES, Engine, EngineError, InputShapeError, auto_order, native_bf16
from irbis.kernels.engines.export import export_onnx
from irbis.kernels.engines.exported import ExportedNetwork
from irbis.kernels.inference import clear_cache, load_network, make_torch_predict_fn, resolve_source
from irbis.models import ModelRepository, build_model

EXPORTED = [name for name in ("onnxruntime", "openvino") if ENGINES[name].installed()]
#: Every engine equals eager fp32 within this tolerance, relative to the largest output value.
TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def cache_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path_factory.getbasetemp() / "engines-home"))
    yield
    clear_cache()


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle")
    options = {"in_features": 64, "hidden": 32, "out_features": 10}
    torch.manual_seed(0)
    net = build_model("mlp", **options).eval()
    (folder / "architecture.json").write_text(json.dumps({"architecture": "mlp", "options": options}))
    torch.save(net.state_dict(), folder / "weights.pt")
    return folder, net


def _photo_crops(n=6, size=224):
    """Crops of the photographs shipped with scikit-learn, normalised as the ImageNet models expect."""
    from sklearn.datasets import load_sample_images

    crops = [img[y:y + size, x:x + size] for img in load_sample_images().images
             for y, x in [(0, 0), (100, 150), (200, 300)]][:n]
    x = np.stack(crops).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    return (x - 0.5) / 0.25


def _hooked(net, x, layer):
    """The eager module's output at ``layer`` (the final output when empty), by a forward hook."""
    seen = []
    handle = net.get_submodule(layer).register_forward_hook(lambda m, i, o: seen.append(o)) if layer else None
    with torch.no_grad():
        final = net(torch.from_numpy(x))
    if handle:
        handle.remove()
    return (seen[0] if layer else final).reshape(len(x), -1).numpy()


def _close(got, expected):
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= TOLERANCE * max(1.0, np.abs(expected).max())


@pytest.mark.parametrize("engine", EXPORTED + ["auto"])
@pytest.mark.parametrize("layer", ["", "_blocks.4", "_avg_pooling"])
def test_engines_equal_eager_fp32_on_a_shipped_network(engine, layer):
    net = ModelRepository().load_model("efficientnet_lite0").eval()
    x = _photo_crops()
    fn = make_torch_predict_fn(resolve_source("efficientnet_lite0"), engine=engine, output_layer=layer or None,
                               batch_size=4)
    _close(fn(x), _hooked(net, x, layer))


@pytest.mark.parametrize("engine", EXPORTED)
@pytest.mark.parametrize("layer", ["", "0", "1"])
def test_engines_equal_a_forward_hook_on_a_custom_network(mlp_bundle, engine, layer):
    folder, net = mlp_bundle
    from sklearn.datasets import load_digits

    x = (load_digits().data[:30] / 16.0).astype(np.float32)
    fn = make_torch_predict_fn(resolve_source(str(folder)), engine=engine, output_layer=layer or None, batch_size=7)
    _close(fn(x), _hooked(net, x, layer))


@pytest.mark.parametrize("engine", EXPORTED + ["torch"])
def test_several_layers_in_one_pass_equal_each_layer_read_alone(mlp_bundle, engine, tmp_path, monkeypatch):
    """One forward pass (one export, with one output per layer) gives what each single-layer cut gives."""
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path))
    folder, net = mlp_bundle
    from sklearn.datasets import load_digits

    x = (load_digits().data[:30] / 16.0).astype(np.float32)
    source = resolve_source(str(folder))
    both = make_torch_predict_fn(source, engine=engine, output_layer=("1", "0"), batch_size=7)(x)
    assert list(both) == ["1", "0"]
    for layer in ("0", "1"):
        np.testing.assert_array_equal(both[layer], make_torch_predict_fn(source, engine=engine, output_layer=layer,
                                                                          batch_size=7)(x))
        _close(both[layer], _hooked(net, x, layer))
    exports = list((tmp_path / "models" / "prepared").glob("*.onnx"))
    assert len(exports) == (0 if engine == "torch" else 3)  # the pair, and each layer alone
    with pytest.raises(ValueError, match=r"'9' is not a module of the network; the nearest names"):
        make_torch_predict_fn(source, engine=engine, output_layer=("0", "9"))(x)


@pytest.mark.parametrize("engine", EXPORTED)
def test_network_is_exported_once_beside_the_prepared_weights(mlp_bundle, engine, tmp_path, monkeypatch):
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path))
    folder, _ = mlp_bundle
    x = np.zeros((3, 64), np.float32)
    for name in EXPORTED:
        make_torch_predict_fn(resolve_source(str(folder)), engine=name)(x)
    assert len(list((tmp_path / "models" / "prepared").glob("*.onnx"))) == 1


@pytest.mark.parametrize("engine", EXPORTED + ["torch"])
def test_unknown_output_layer_lists_the_nearest_names(engine):
    with pytest.raises(ValueError, match=r"nearest names: \['_blocks.3'"):
        fn = make_torch_predict_fn(resolve_source("efficientnet_lite0"), engine=engine, output_layer="_block.3")
        fn(np.zeros((1, 3, 224, 224), np.float32))


@pytest.mark.parametrize("engine", EXPORTED)
def test_a_process_that_finds_the_export_cached_runs_it_without_torch(mlp_bundle, engine, tmp_path):
    """A Spark worker running an exported engine stays free of torch (~300 MiB per process)."""
    folder, net = mlp_bundle
    env = dict(os.environ, IRBIS_HOME=str(tmp_path))
    x = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = (f"import sys, numpy as np; from irbis.kernels.inference import make_torch_predict_fn, set_threads; "
            f"set_threads(1); fn = make_torch_predict_fn({{'kind': 'bundle', 'path': {str(folder)!r}}}, "
            f"engine={engine!r}); np.save({str(tmp_path / 'y.npy')!r}, fn(np.load({str(tmp_path / 'x.npy')!r})));"
            f"print('torch' in sys.modules)")
    first, second = (subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout.split()[-1] for _ in range(2))
    assert (first, second) == ("True", "False")  # the first process exports, the next one finds the file
    _close(np.load(tmp_path / "y.npy"), net(torch.from_numpy(x)).detach().numpy())


@pytest.mark.parametrize("engine", EXPORTED)
def test_an_engine_refusing_a_batch_at_run_time_raises_input_shape_error(mlp_bundle, engine):
    folder, _ = mlp_bundle
    network = ExportedNetwork(lambda: load_network(resolve_source(str(folder))), "refusal", engine, None,
                              "cpu", "fp32", 1)
    network.runners[(63,)] = network._runner((64,))  # a real session whose graph takes 64 values per row
    with pytest.raises(InputShapeError, match=rf"{engine} refused a batch of shape \[2, 63\]"):
        network.predict(np.zeros((2, 63), np.float32), 8, None)


def test_a_network_refusing_the_export_shape_raises_input_shape_error(mlp_bundle):
    folder, _ = mlp_bundle
    with pytest.raises(InputShapeError, match="mat1 and mat2"):
        export_onnx(lambda: load_network(resolve_source(str(folder))), None, (63,), "refusal-63")


def _onnx_nodes(path):
    """The nodes of an ONNX file as (op, attributes), with the names of the values left out."""
    import onnx

    graph = onnx.load(str(path)).graph
    weights = sorted((t.name, onnx.numpy_helper.to_array(t).tobytes()) for t in graph.initializer)
    return [(n.op_type, [str(a) for a in n.attribute]) for n in graph.node], weights


def test_in_place_activations_export_the_same_graph_and_stay_in_place(tmp_path):
    """The exporter traces in-place activations out of place: same graph, same outputs, flags restored."""
    torch.manual_seed(0)

    def conv_net(inplace):
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU6(inplace=inplace), torch.nn.Conv2d(8, 4, 1),
                                   torch.nn.ReLU(inplace=inplace), torch.nn.AdaptiveAvgPool2d(1)).eval()

    net, plain = conv_net(True), conv_net(False)
    plain.load_state_dict(net.state_dict())
    in_place = export_onnx(lambda: net, None, (3, 16, 16), "in-place", tmp_path)
    out_of_place = export_onnx(lambda: plain, None, (3, 16, 16), "out-of-place", tmp_path)
    assert [m.inplace for m in (net[1], net[3])] == [True, True]
    assert _onnx_nodes(in_place) == _onnx_nodes(out_of_place)
    x = np.random.default_rng(0).normal(size=(5, 3, 16, 16)).astype(np.float32)
    for engine in EXPORTED:
        run = ENGINES[engine].load(str(in_place), threads=1, device="cpu", precision="fp32")
        _close(run(x).reshape(5, -1), net(torch.from_numpy(x)).detach().numpy().reshape(5, -1))


def test_an_engine_that_is_not_installed_names_its_package():
    engine = Engine("fastest", "irbis_no_such_engine", "irbis-no-such-engine", "irbis.kernels.engines.ort")
    assert not engine.installed()
    with pytest.raises(ImportError, match="pip install irbis-no-such-engine"):
        engine.load("model.onnx", threads=1, device="cpu", precision="fp32")


def test_auto_falls_back_to_torch_once_with_a_log_line(tmp_path, caplog):
    """A TorchScript file cannot be exported: an exported engine names why, auto runs it eagerly."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(net), str(path))
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    if EXPORTED:
        with pytest.raises(EngineError, match="TorchScript"):
            make_torch_predict_fn(resolve_source(str(path)), engine=EXPORTED[0])(x)
    with caplog.at_level(logging.WARNING, logger="irbis.inference"):
        for _ in range(3):  # a stage makes its predict fn per batch: the fallback is logged once per process
            fn = make_torch_predict_fn(resolve_source(str(path)), engine="auto")
            _close(fn(x), net(torch.from_numpy(x)).detach().numpy())
    assert len([r for r in caplog.records if "using" in r.getMessage()]) == len(auto_order("cpu", "fp32")) - 1


def test_auto_rule():
    assert auto_order("cuda", "bf16") == auto_order("cuda", "fp32") == ("torch",)
    assert auto_order("cpu", "fp32") == tuple(EXPORTED) + ("torch",)
    assert auto_order("cpu", "bf16") == (("openvino",) if native_bf16() else ()) + ("torch",)
    assert auto_order("cpu", "int8") == tuple(e for e in EXPORTED if e == "onnxruntime") + ("torch",)


def test_auto_rule_of_text_networks_and_onnx_graphs_is_a_row_of_the_same_table():
    import importlib.util

    assert auto_order("cuda:1", "fp32", "text") == ("torch",)
    assert auto_order("cpu", "fp32", "text") == (("openvino",) if "openvino" in EXPORTED else ()) + ("torch",) + (
        ("onnxruntime",) if "onnxruntime" in EXPORTED else ())
    assert auto_order("cpu", "bf16", "text") == auto_order("cpu", "bf16")
    nncf = "openvino" in EXPORTED and importlib.util.find_spec("nncf") is not None
    assert auto_order("cpu", "int8", "text") == (("openvino",) if nncf else ()) + ("onnxruntime",)
    assert auto_order("cuda", "fp32", "onnx") == auto_order("cpu", "fp32", "onnx") == tuple(EXPORTED)
    with pytest.raises(ValueError, match="input kind"):
        auto_order("cpu", "fp32", "audio")


def test_native_bf16_follows_the_cpu_flags():
    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else None
    if flags is None or "openvino" not in EXPORTED:
        pytest.skip("needs Linux's /proc/cpuinfo and OpenVINO")
    assert native_bf16() == bool({"avx512_bf16", "amx_bf16"} & set(flags))


def _relu_file(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


@pytest.fixture
def session_options_seen(monkeypatch):
    """The SessionOptions of every ONNX Runtime session built while the test runs."""
    import onnxruntime

    seen, real = [], onnxruntime.InferenceSession

    def session(p, options, **kw):
        seen.append(options)
        return real(p, options, **kw)

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    return seen


def test_ort_threads_can_stop_spinning_after_each_run_for_a_server(tmp_path, session_options_seen):
    from irbis.kernels.engines import ort as ort_engine

    path, seen = _relu_file(tmp_path), session_options_seen
    try:
        ort_engine.set_thread_spinning(False)
        run = ort_engine.load(str(path), threads=2, device="cpu", precision="fp32")
    finally:
        ort_engine.set_thread_spinning(True)
    ort_engine.load(str(path), threads=2, device="cpu", precision="fp32")
    assert run(np.array([[-1.0, 0.5, 2.0]], np.float32)).tolist() == [[0.0, 0.5, 2.0]]
    assert seen[0].get_session_config_entry("session.force_spinning_stop") == "1"
    with pytest.raises(RuntimeError, match="force_spinning_stop"):  # not set: ONNX Runtime's default
        seen[1].get_session_config_entry("session.force_spinning_stop")


@pytest.mark.parametrize("tunables, thp, expected", [
    ("glibc.malloc.hugetlb=1", "always [madvise] never", True),
    ("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "[always] madvise never", True),
    ("glibc.malloc.hugetlb=1", "always madvise [never]", False),
    ("glibc.malloc.hugetlb=0", "always [madvise] never", False),
    (None, "[always] madvise never", False),
])
def test_huge_page_malloc_needs_the_glibc_tunable_and_transparent_huge_pages(tmp_path, monkeypatch, tunables,
                                                                             thp, expected):
    from irbis.kernels.engines import exported

    (tmp_path / "enabled").write_text(thp + "\n")
    monkeypatch.setattr(exported, "_THP_MODE", tmp_path / "enabled")
    if tunables is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", tunables)
    assert exported.huge_page_malloc() is expected
    monkeypatch.setattr(exported, "_THP_MODE", tmp_path / "missing")
    assert exported.huge_page_malloc() is False


@pytest.mark.parametrize("huge", [True, False])
def test_ort_sessions_free_activations_after_each_run_only_with_huge_pages(tmp_path, monkeypatch, huge,
                                                                          session_options_seen):
    """With huge pages the arena is off, so an idle worker holds no activations; elsewhere it stays on
    (fresh 4 KiB pages for each batch cost a third of the throughput). ONNXModel's sessions share the options."""
    from irbis.kernels import onnx as onnx_kernel
    from irbis.kernels.engines import ort as ort_engine

    monkeypatch.setattr(ort_engine, "huge_page_malloc", lambda: huge)
    path = _relu_file(tmp_path)
    run = ort_engine.load(str(path), threads=1, device="cpu", precision="fp32")
    onnx_kernel._runner(str(path), (), "onnxruntime", "cpu", 2, "BASIC_OPT")
    assert [o.enable_cpu_mem_arena for o in session_options_seen] == [not huge, not huge]
    assert all(o.enable_mem_pattern for o in session_options_seen)
    assert [o.intra_op_num_threads for o in session_options_seen] == [1, 2]
    assert run(np.array([[-1.0, 0.5, 2.0]], np.float32)).tolist() == [[0.0, 0.5, 2.0]]


@pytest.mark.parametrize("engine", EXPORTED)
def test_engines_give_the_same_outputs_when_they_free_their_buffers_after_each_call(mlp_bundle, engine,
                                                                                   monkeypatch):
    """Freeing the buffers (huge pages) changes nothing in the outputs, and happens once per large call."""
    from irbis.kernels.engines import exported
    from irbis.kernels.engines import ort as ort_engine

    folder, _ = mlp_bundle
    x = np.random.default_rng(0).normal(size=(exported.TRIM_BYTES // 256 + 1, 64)).astype(np.float32)
    released, release = [], exported.release_memory
    monkeypatch.setattr(exported, "release_memory", lambda run=None: (released.append(run), release(run)))
    outputs = {}
    for huge in (False, True):
        monkeypatch.setattr(ort_engine, "huge_page_malloc", lambda: huge)
        if engine == "openvino":
            from irbis.kernels.engines import ov

            monkeypatch.setattr(ov, "huge_page_malloc", lambda: huge)
        clear_cache()
        fn = make_torch_predict_fn(resolve_source(str(folder)), engine=engine, batch_size=4096)
        outputs[huge] = [fn(x), fn(x), fn(x[:3])]
    for before, after in zip(outputs[False], outputs[True]):
        np.testing.assert_array_equal(before, after)
    assert len(released) == 4  # the two large calls of each setting
    if engine == "openvino":
        assert [r.free_buffers for r in released] == [False, False, True, True]


def test_an_export_in_a_thread_does_not_swallow_the_other_threads_output(mlp_bundle, tmp_path, capsys):
    # the driver exports ahead of a job in a thread: whatever the main thread prints meanwhile must show
    import threading

    from irbis.kernels.engines.export import export_onnx

    _, net = mlp_bundle
    printed = threading.Event()

    def main_thread_prints():
        while not printed.is_set():
            print("still here")

    talker = threading.Thread(target=main_thread_prints)
    talker.start()
    try:
        export_onnx(lambda: net, None, (64,), "talk", cache_dir=tmp_path)
    finally:
        printed.set()
        talker.join()
    out = capsys.readouterr().out
    assert out.count("still here") > 10 and "[torch.onnx]" not in out  # the exporter's own prints stay off
