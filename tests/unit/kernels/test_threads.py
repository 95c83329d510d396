"""The thread count a runner gives its kernels, and the one predictor cache keyed by it."""
from __future__ import annotations

import json
import pickle

import cv2
import numpy as np
import pytest
import torch

from irbis.errors import NoKernelError
from irbis.kernels import threads
from irbis.kernels.engines import cached_keys
from irbis.kernels.inference import cached_predict_fn, make_torch_predict_fn
from irbis.kernels.threads import set_threads, task_threads
from irbis.models import build_model


@pytest.fixture
def kept_threads():
    before = (torch.get_num_threads(), cv2.getNumThreads(), list(threads._THREADS))
    yield
    torch.set_num_threads(before[0])
    cv2.setNumThreads(before[1])
    threads._THREADS[:] = before[2]


def test_set_threads_reaches_torch_opencv_and_the_engines(kept_threads):
    set_threads(1)
    assert (task_threads(), torch.get_num_threads(), cv2.getNumThreads()) == (1, 1, 1)
    set_threads(0)  # no count: everything stays as it was
    set_threads(None)
    assert (task_threads(), torch.get_num_threads()) == (1, 1)


def test_one_predictor_per_network_options_and_threads(kept_threads, tmp_path):
    options = {"in_features": 8, "hidden": 4, "out_features": 3}
    (tmp_path / "architecture.json").write_text(json.dumps({"architecture": "mlp", "options": options}))
    torch.save(build_model("mlp", **options).state_dict(), tmp_path / "weights.pt")
    source = {"kind": "bundle", "path": str(tmp_path)}
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    want = make_torch_predict_fn(source, engine="torch")(x)

    def predictors() -> int:
        return sum(key.startswith('["predict"') for key in cached_keys())

    before = predictors()
    set_threads(1)
    predict = cached_predict_fn(source, engine="torch", batch_size=4)
    np.testing.assert_allclose(predict(x), want, rtol=1e-6)
    np.testing.assert_allclose(cached_predict_fn(source, engine="torch", batch_size=4)(x), want, rtol=1e-6)
    assert predictors() == before + 1  # the same network and options: one predictor
    pickle.loads(pickle.dumps(predict))(x)
    assert predictors() == before + 1  # a copy sent to a worker finds the same one
    cached_predict_fn(source, engine="torch", batch_size=8)(x)
    set_threads(2)
    np.testing.assert_allclose(predict(x), want, rtol=1e-6)
    assert predictors() == before + 3  # other options, another thread count: a predictor each


def test_no_kernel_error_crosses_processes_whole():
    err = pickle.loads(pickle.dumps(NoKernelError(["A", "B"], "these stages have no kernel: A, B")))
    assert (type(err), err.classes, err.cls, str(err)) == (NoKernelError, ["A", "B"], "A",
                                                           "these stages have no kernel: A, B")


def test_for_each_row_runs_every_row_and_raises_the_first_bad_one_in_row_order():
    seen = np.zeros(50, int)

    def work(i):
        seen[i] += 1
        if i in (7, 31):
            raise ValueError(f"row {i}")

    with pytest.raises(ValueError, match="row 7"):
        threads.for_each_row(work, 50, threads=4)
    assert (seen == 1).all()  # every row ran once, the bad ones too
    threads.for_each_row(lambda i: seen.__setitem__(i, seen[i] + 1), 50, threads=1)
    assert (seen == 2).all()
