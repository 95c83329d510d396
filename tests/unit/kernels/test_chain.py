"""KernelChain: the columns a chain reads from outside, with their kinds, and running it."""
from __future__ import annotations

import numpy as np
import pytest

from irbis.errors import NoKernelError
from irbis.kernels.blocks import Tensor, run_steps
from irbis.kernels.chain import ANY_VALUE, KernelChain, StageColumns, StageKernel


def _steps() -> list[StageKernel]:
    scale = StageKernel(["x"], ["y"], lambda b: {"y": Tensor(b["x"].values * 2, b["x"].valid)},
                        kinds={"x": frozenset({"vector"})})
    add = StageKernel(["y", "z"], ["w"], lambda b: {"w": Tensor(b["y"].values + b["z"].values, b["y"].valid)},
                      kinds={"y": frozenset({"image"}), "z": frozenset({"number", "vector"})}, nulls=False)
    last = StageKernel(["w", "z", "v"], ["out"],
                       lambda b: {"out": Tensor(b["w"].values - b["z"].values, b["w"].valid)},
                       kinds={"z": frozenset({"vector", "string"})}, types={"out": "vector"})
    return [scale, add, last]


def test_inputs_are_the_columns_no_earlier_step_writes():
    chain = KernelChain(_steps())
    assert list(chain.inputs) == ["x", "z", "v"]  # y and w are written before they are read
    assert chain.inputs["x"] == {"vector"}         # the one reader's kinds
    assert chain.inputs["z"] == {"vector"}         # every outside reader's kinds at once
    assert chain.inputs["v"] == ANY_VALUE          # declared by none
    assert chain.nullable == {"x": True, "z": False, "v": True}
    assert chain.outputs == ["y", "w", "out"] and chain.consumed == {"y", "w"}
    assert chain.last_outputs == ["out"] and chain.types == {"out": "vector"}


def test_run_gives_what_the_steps_give_by_hand():
    x = Tensor(np.arange(6.0).reshape(3, 2), np.ones(3, bool))
    z = Tensor(np.ones((3, 2)), np.ones(3, bool))
    blocks = {"x": x, "z": z, "v": np.zeros(3)}
    steps = _steps()
    out = KernelChain(steps).run(blocks)
    by_hand = run_steps([(k.inputs, k.fn) for k in steps], blocks)
    assert set(out) == {"x", "z", "v", "y", "w", "out"}
    for column in out:
        got, want = out[column], by_hand[column]
        np.testing.assert_array_equal(getattr(got, "values", got), getattr(want, "values", want))
    np.testing.assert_array_equal(out["out"].values, x.values * 2)


def test_a_step_without_kernel_is_named():
    columns = StageColumns("Repartition", ["x"], ["x2"], uid="Repartition_1")
    chain = KernelChain([_steps()[0], columns])
    assert list(chain.inputs) == ["x"] and chain.missing == [columns]
    with pytest.raises(NoKernelError, match=r"Repartition \(Repartition_1\)") as err:
        chain.run({"x": Tensor(np.zeros((1, 2)), np.ones(1, bool))})
    assert err.value.classes == ["Repartition"]


def test_a_sparkml_stage_without_kernel_reads_its_column_params():
    from irbis.ml.kernel_pipeline import param_columns

    assembler = param_columns("VectorAssembler", {"inputCols": ["a", "b"], "outputCol": "features"}, "va")
    model = param_columns("SomeModel", {"featuresCol": "features", "predictionCol": "prediction"})
    chain = KernelChain([assembler, model])
    assert chain.inputs == {"a": {"number", "vector"}, "b": {"number", "vector"}}
    assert chain.outputs == ["features", "prediction"] and chain.consumed == {"features"}
    assert [s.name for s in chain.missing] == ["VectorAssembler", "SomeModel"]
