"""The seam holds at run time: a batch goes down the layers and comes back up once.

The layering test reads imports; a closure defined in a stage and called by a kernel imports nothing, yet
calls back up a layer. Here the calls themselves are traced (``sys.setprofile`` on every thread) while a
batch of texts goes through ``TextEmbedder``, a batch of rows through ``TorchModel``, a batch of image files
through ``ImageFeaturizer``, and a training run
through the workers' loop (``train_worker`` on threads, as each Spark task runs it): every call whose
code lives in Irbis is checked against the nearest Irbis frame that made it, and a call from a lower
layer into a higher one is a crossing. The checker is shown to catch a planted closure. On Spark, the
runner (``irbis.spark``) calls what ``_make_batch_fn`` gives: the last test checks it is a plain value of the
kernels' layer for every network stage, never a stage's closure.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from test_layering import LAYERS

#: Where torch calls a module's forward hooks. A kernel that reads an inner layer registers a hook on the
#: network (``run_to_layer``) and torch calls it from within the network's forward pass, whose frames may be
#: Irbis's own networks (``irbis.models``, the layer below the kernels): the network's code never names the
#: hook, so the call is torch's on the kernel's behalf, not the network calling back up.
TORCH_DISPATCH = "torch.nn.modules.module"
RANK = {package: i for i, (_, packages) in enumerate(LAYERS) for package in packages}


def layer(module: str) -> int | None:
    """The layer of a module (the longest package of the table that holds it); None outside Irbis. The
    package's face, ``irbis`` itself, re-exports names and runs nothing: it is left out."""
    best = None
    for package, rank in RANK.items():
        if package != "irbis" and (module == package or module.startswith(package + ".")):
            if best is None or len(package) > len(best[0]):
                best = (package, rank)
    return None if best is None else best[1]


def upward_calls(work: Callable[[], Any]) -> tuple[list[str], int]:
    """Run ``work`` and return the calls from a lower layer into a higher one (as ``caller -> callee``), and
    how many calls into Irbis were seen."""
    crossings: list[str] = []
    seen = [0]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        to = layer(callee)
        if to is None:
            return
        seen[0] += 1
        caller = frame.f_back
        if caller is not None and caller.f_globals.get("__name__") == TORCH_DISPATCH and \
                frame.f_code.co_name != "forward":
            return  # a hook that a kernel registered on the network, called by torch (TORCH_DISPATCH)
        while caller is not None and layer(caller.f_globals.get("__name__", "")) is None:
            caller = caller.f_back  # through numpy, pandas, torch or the standard library
        if caller is None:
            return
        name = caller.f_globals["__name__"]
        frm = layer(name)
        if frm is not None and to > frm:
            crossings.append(f"{name}.{caller.f_code.co_name} -> {callee}.{frame.f_code.co_name}")

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return sorted(set(crossings)), seen[0]


def test_the_checker_catches_a_stage_closure_that_a_kernel_calls() -> None:
    from irbis.kernels.blocks import flat_rows

    planted: dict[str, Any] = {"__name__": "irbis.ml.planted"}
    exec("def closure(x):\n    return x\n", planted)  # noqa: S102 - a function whose module is a stage's
    kernel: dict[str, Any] = {"__name__": "irbis.kernels.planted"}
    exec("def run(fn, x):\n    return fn(x)\n", kernel)  # noqa: S102

    crossings, _ = upward_calls(lambda: kernel["run"](planted["closure"], flat_rows(np.ones((2, 3)))))
    assert crossings == ["irbis.kernels.planted.run -> irbis.ml.planted.closure"]


def test_a_batch_of_texts_through_text_embedder_never_calls_back_up() -> None:
    from irbis import TextEmbedder

    texts = pd.DataFrame({"text": ["a snow leopard on the ridge", "no animal, only wind", None]})
    stage = TextEmbedder(inputCol="text", outputCol="embedding", engine="torch", errorCol="error")
    out: dict[str, pd.DataFrame] = {}
    crossings, seen = upward_calls(lambda: out.setdefault("frame", stage.transform(texts)))
    assert out["frame"]["embedding"][0].shape == (384,)
    assert seen > 100  # the trace saw the stage, its kernel and the engine at work
    assert crossings == []


def test_a_batch_of_rows_through_torch_model_never_calls_back_up() -> None:
    from irbis import TorchModel

    stage = TorchModel.from_module(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), inputCol="x",
                                   outputCol="y", inputShape=[4], engine="torch")
    rows = pd.DataFrame({"x": [np.ones(4, np.float32), None, np.arange(4, dtype=np.float32)]})
    out: dict[str, pd.DataFrame] = {}
    crossings, seen = upward_calls(lambda: out.setdefault("frame", stage.transform(rows)))
    assert out["frame"]["y"][0].shape == (3,) and out["frame"]["y"][1] is None
    assert seen > 50
    assert crossings == []


@pytest.mark.parametrize("strategy", ["sync", "downpour"])
def test_a_training_run_of_the_workers_loop_never_calls_back_up(strategy: str) -> None:
    from sklearn.datasets import load_digits

    from irbis.train.backends.local import run_threads, shard_rows
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec

    digits = load_digits()
    x, y = (digits.data[:240] / 16.0).astype(np.float32), digits.target[:240].astype(np.int64)
    spec = TrainSpec.of(network_spec("mlp", {"in_features": 64, "hidden": 16, "out_features": 10}), epochs=1,
                        batchSize=16, optimizer="sgd", learningRate=0.1, strategy=strategy,
                        validationFraction=0.2)
    results: list[Any] = []
    crossings, seen = upward_calls(lambda: results.extend(run_threads(spec, shard_rows(x, y, 2))))
    assert results[0].history and results[0].state is not None
    assert seen > 300  # the loop, the rows, the strategy and the network at work on both threads
    assert crossings == []


def test_a_batch_of_images_through_an_image_featurizer_never_calls_back_up() -> None:
    import cv2

    from irbis import ImageFeaturizer

    rng = np.random.default_rng(0)
    files = [cv2.imencode(".png", rng.integers(0, 256, (40, 60, 3), dtype=np.uint8))[1].tobytes(), b"not an image"]
    stage = ImageFeaturizer(inputCol="content", outputCol="features", engine="torch", errorCol="error")
    out: dict[str, pd.DataFrame] = {}
    crossings, seen = upward_calls(lambda: out.setdefault("frame", stage.transform(pd.DataFrame({"content": files}))))
    assert out["frame"]["features"][0].shape == (1280,) and out["frame"]["features"][1] is None
    assert out["frame"]["error"][1]  # the bad file's reason
    assert seen > 100
    assert crossings == []


def test_every_stage_kernel_is_a_plain_value_of_a_pure_layer() -> None:
    """What the Spark runner ships to the executors for every stage that has a kernel (each stage of the
    conformance harness, an ImageFeaturizer at several layers and a fitted TabularLIMEModel beside them): a
    value defined in a pure layer below the stages (``irbis.kernels``, or ``irbis.explain`` for LIME), which the
    standard pickle takes (a closure of a stage's method it cannot), so no executor calls back into a stage."""
    import pickle

    from irbis import ImageFeaturizer, TabularLIMEModel
    from stage_cases import STAGE_CASES, tiny_torch_model

    stages = [case.make_stage() for case in STAGE_CASES.values()]
    stages += [ImageFeaturizer(inputCol="content", outputLayers=["_blocks.3", "_blocks.12"], outputCols=["a", "b"]),
               TabularLIMEModel(model=tiny_torch_model(), inputCol="vec", targetCol="scores", targetClasses=[0],
                                numSamples=20, featureMeans=[0.0, 0.0], featureStds=[1.0, 1.0])]
    checked = set()
    for stage in stages:
        if not getattr(stage, "has_kernel", lambda: False)():
            continue
        kernel = stage._make_batch_fn()
        assert type(kernel).__module__.split(".")[:2] in (["irbis", "kernels"], ["irbis", "explain"]), \
            (type(stage).__name__, kernel)
        assert type(pickle.loads(pickle.dumps(kernel))) is type(kernel)
        checked.add(type(stage).__name__)
    assert {"FusedStages", "ImageLIME", "TextLIME", "TabularLIMEModel", "ImageFeaturizer", "TextEmbedder",
            "TorchModel", "ONNXModel", "ImageDecoder"} <= checked, checked
