"""Reading SparkML's saved state without Spark: vector and matrix structs, Params, tree walks."""
from __future__ import annotations

import json

import numpy as np
import pytest

from irbis.kernels.sparkml.stage_kernels import NoKernelError, kernel_from_state, load_sparkml_kernel
from irbis.kernels.sparkml.state import StageState, _udt, read_stage
from irbis.kernels.sparkml.trees import Tree


def test_vector_structs_dense_and_sparse():
    assert _udt({"type": 1, "size": None, "indices": None, "values": [1.0, 2.0]}).tolist() == [1.0, 2.0]
    sparse = {"type": 0, "size": 4, "indices": [1, 3], "values": [5.0, 6.0]}
    assert _udt(sparse).tolist() == [0.0, 5.0, 0.0, 6.0]


@pytest.mark.parametrize("transposed", [False, True])
def test_matrix_structs_dense_and_sparse(transposed):
    m = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    order = m if transposed else m.T
    dense = {"type": 1, "numRows": 2, "numCols": 3, "colPtrs": None, "rowIndices": None,
             "values": order.ravel().tolist(), "isTransposed": transposed}
    np.testing.assert_array_equal(_udt(dense), m)
    pointers, indices, values = [0], [], []
    for line in order:  # CSC of m, or CSR when transposed
        indices += np.flatnonzero(line).tolist()
        values += line[line != 0].tolist()
        pointers.append(len(indices))
    sparse = {"type": 0, "numRows": 2, "numCols": 3, "colPtrs": pointers, "rowIndices": indices,
              "values": values, "isTransposed": transposed}
    np.testing.assert_array_equal(_udt(sparse), m)


def _node(i, left=-1, right=-1, feature=-1, split=(), categories=-1, prediction=0.0):
    return {"id": i, "prediction": prediction, "impurityStats": [1.0], "leftChild": left, "rightChild": right,
            "split": {"featureIndex": feature, "leftCategoriesOrThreshold": list(split),
                      "numCategories": categories}}


def test_tree_walk_continuous_and_categorical_splits():
    # 0: x0 <= 0.5 ? 1 : 2;  2: x1 in {1, 3} ? 3 : 4
    tree = Tree([_node(0, 1, 2, 0, [0.5]), _node(1, prediction=10.0), _node(2, 3, 4, 1, [1.0, 3.0], 4),
                 _node(3, prediction=20.0), _node(4, prediction=30.0)])
    x = np.array([[0.5, 3.0], [0.7, 3.0], [0.7, 2.0], [np.nan, 1.0]])
    assert tree.prediction[tree.leaves(x)].tolist() == [10.0, 20.0, 30.0, 20.0]


def test_saved_folder_params_and_an_unknown_class(tmp_path):
    (tmp_path / "metadata").mkdir()
    meta = {"class": "org.apache.spark.ml.feature.PCAModel", "paramMap": {"k": 2},
            "defaultParamMap": {"k": 1, "inputCol": "x"}}
    (tmp_path / "metadata" / "part-00000").write_text(json.dumps(meta) + "\n")
    state = read_stage(str(tmp_path))
    assert (state.cls, state.param("k"), state.param("inputCol")) == ("PCAModel", 2, "x")
    with pytest.raises(NoKernelError, match="SparkML stage PCAModel has no kernel; stages with kernels: "):
        load_sparkml_kernel(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a saved Spark ML stage"):
        read_stage(str(tmp_path / "metadata"))


def test_bad_blocks_name_the_stage_and_column():
    scaler = kernel_from_state(StageState("StandardScalerModel", {"inputCol": "v", "outputCol": "o"},
                                          {"mean": np.zeros(2), "std": np.ones(2)}))
    with pytest.raises(TypeError, match="StandardScalerModel: column 'v' must hold vectors, found ndarray"):
        scaler.fn({"v": np.array([1.0, 2.0])})
    imputer = kernel_from_state(StageState("ImputerModel", {"inputCol": "a", "outputCol": "b"}, {"a": 1.5}))
    assert imputer.fn({"a": np.array([1.0, np.nan])})["b"].tolist() == [1.0, 1.5]
    with pytest.raises(TypeError, match="ImputerModel: column 'a' must hold numbers, found str"):
        imputer.fn({"a": np.array(["x", None], object)})
