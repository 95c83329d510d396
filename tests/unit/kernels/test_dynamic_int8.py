"""int8 on ``engine="torch"``: the fully connected layers quantised dynamically, by ONNX Runtime on the network's
export, without PyTorch's deprecated ``torch.ao.quantization``; measured against eager fp32 on real photographs."""

from __future__ import annotations

import glob
import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from irbis.demo.photos import check_precision
from irbis.kernels.engines.export import export_onnx
from irbis.kernels.engines.quantize import gemm_as_matmul
from irbis.kernels.inference import clear_cache
from irbis.models import build_model, default_cache_dir

MODEL = "efficientnet_lite0"
#: The top-1 agreement PyTorch's dynamic int8 (``torch.ao.quantization.quantize_dynamic``) had with fp32 on the
#: 56 crops of ``models check``: 55 of them kept their class.
TORCH_AO_AGREEMENT = 55 / 56


@pytest.fixture(autouse=True)
def cache_home(tmp_path_factory, monkeypatch):
    # the folder of test_precision.py, so a session running both exports EfficientNet-Lite0 once
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path_factory.getbasetemp() / "precision-home"))
    yield
    clear_cache()


def test_dynamic_int8_keeps_the_answers_with_no_deprecated_machinery():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = check_precision(MODEL, "int8", engine="torch")
    deprecated = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, DeprecationWarning)]
    assert not deprecated, deprecated
    assert report["agreement"] >= TORCH_AO_AGREEMENT, report
    quantised = glob.glob(str(default_cache_dir() / "prepared" / "*.int8-dynamic-*.onnx"))
    assert len(quantised) == 1
    exported = quantised[0].split(".int8-dynamic-")[0] + ".onnx"
    ops, before = (Counter(n.op_type for n in onnx.load(f).graph.node) for f in (quantised[0], exported))
    assert before["Gemm"] == 1 and ops["MatMulInteger"] == 1 and "Gemm" not in ops  # the classifier, in int8
    assert ops["Conv"] == before["Conv"] and "ConvInteger" not in ops  # the convolutions, in fp32


def test_gemm_rewritten_as_matmul_computes_the_same(tmp_path):
    torch.manual_seed(0)
    net = build_model("mlp", in_features=64, hidden=32, out_features=10).eval()
    path = export_onnx(lambda: net, None, (64,), "mlp", cache_dir=tmp_path)
    model = onnx.load(path)
    assert "Gemm" in {n.op_type for n in model.graph.node}
    gemm_as_matmul(model.graph)
    assert "Gemm" not in {n.op_type for n in model.graph.node}
    rewritten = tmp_path / "rewritten.onnx"
    onnx.save(model, rewritten)
    x = np.random.default_rng(0).normal(size=(7, 64)).astype(np.float32)
    runs = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (path, rewritten)]
    first, second = (s.run(None, {s.get_inputs()[0].name: x})[0] for s in runs)
    np.testing.assert_allclose(second, first, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(second, net(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)
