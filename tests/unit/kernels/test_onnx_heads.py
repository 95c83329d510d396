"""SynapseML's softmax and argmax heads of ONNXModel, and its optimisation levels, as pure kernels."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from irbis.kernels.onnx import OPTIMIZATION_LEVELS, apply_heads, argmax_rows, make_onnx_predict_fn, softmax_rows


def _relu_graph(folder):
    """A one-node ONNX graph, y = relu(x) over rows of 2, written to ``folder/relu.onnx``."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = folder / "relu.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_softmax_rows_is_stable_and_sums_to_one():
    scores = np.array([[1000.0, 1001.0, 999.0], [0.0, 0.0, 0.0]], np.float32)
    probs = softmax_rows(scores)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    np.testing.assert_allclose(probs[1], [1 / 3] * 3)
    assert probs[0].argmax() == 1 and np.isfinite(probs).all()
    assert softmax_rows(np.zeros((0, 3))).shape == (0, 3)


def test_heads_chain_softmax_then_argmax_and_name_unknown_columns():
    out = apply_heads({"raw": np.array([[0.1, 2.0], [3.0, -1.0]])}, {"raw": "p"}, {"p": "label"})
    np.testing.assert_array_equal(out["label"], [1.0, 0.0])
    assert out["label"].dtype == np.float64 and argmax_rows(np.zeros((0, 2))).shape == (0,)
    with pytest.raises(ValueError, match="column 'nope' is not an output.*\\['raw'\\]"):
        apply_heads({"raw": np.zeros((1, 2))}, {}, {"nope": "label"})


@pytest.mark.parametrize("level", list(OPTIMIZATION_LEVELS))
def test_every_optimization_level_gives_the_same_result(tmp_path, level):
    path = _relu_graph(tmp_path)
    run = make_onnx_predict_fn(str(path), ["y"], optimization_level=level)
    np.testing.assert_array_equal(run({"x": np.array([[-1.0, 2.0]], np.float32)})["y"], [[0.0, 2.0]])


def test_auto_runs_a_graph_on_the_first_installed_engine_and_names_the_package_when_none_is(monkeypatch):
    from irbis.kernels import engines
    from irbis.kernels.onnx import ONNX_ENGINES, onnx_engine

    installed = {name: engines.ENGINES[name].installed() for name in ONNX_ENGINES[1:]}
    expected = next((name for name, found in installed.items() if found), None)
    if expected is not None:
        assert onnx_engine("auto") == expected
    assert onnx_engine("openvino") == "openvino"
    for name in ONNX_ENGINES[1:]:
        monkeypatch.setitem(engines.ENGINES, name, engines.Engine(name, "no_such_module_here", name, ""))
    with pytest.raises(ImportError, match="pip install onnxruntime"):
        onnx_engine("auto")


def test_the_onnx_kernel_is_a_value_that_names_its_graph_and_reads_it_where_it_lands(tmp_path):
    import pickle
    import shutil

    from irbis.kernels.onnx import OnnxKernel

    path = _relu_graph(tmp_path)
    kernel = OnnxKernel(str(path), {"x": "in"}, {"out": "y"}, {"x": [2]}, {"x": np.float32}, argmax={"out": "label"})
    assert kernel.files == (str(path),)
    landed = shutil.copy(path, tmp_path / "landed.onnx")
    moved = pickle.loads(pickle.dumps(kernel)).relocated({str(path): str(landed)})
    assert moved.files == (str(landed),) and moved.relocated({}) == moved
    path.unlink()  # the moved kernel reads the copy only
    from irbis.kernels.blocks import Tensor

    out = moved({"in": Tensor(np.array([[-1.0, 2.0]], np.float32), np.array([True, False]))})
    assert out["out"].valid.tolist() == [True, False]
    np.testing.assert_array_equal(out["out"].values, [[0.0, 2.0]])
    assert out["label"][0] == 1.0
