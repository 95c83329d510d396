"""The progress channel: rank 0 reports within each epoch, and the driver's bar moves with it."""

import threading
import time

import numpy as np
from sklearn.datasets import load_digits

from irbis.train.backends.local import run_threads, shard_rows
from irbis.train.loop import TrainSpec
from irbis.train.networks import network_spec
from irbis.train.progress import ProgressClient, ProgressServer


def _records(epochs=2):
    x, y = load_digits(return_X_y=True)
    spec = TrainSpec.of(network=network_spec("mlp", {"in_features": 64, "hidden": 16, "out_features": 10}),
                        epochs=epochs, batchSize=8, learningRate=0.01)
    got, lock = [], threading.Lock()

    def report(rec):
        with lock:
            got.append(dict(rec))

    run_threads(spec, shard_rows((x[:640] / 16).astype(np.float32), y[:640], 2), report=report)
    return got


def test_rank_zero_reports_within_each_epoch_then_the_epoch():
    got = _records()
    full = [r for r in got if "step" not in r]
    assert [r["epoch"] for r in full] == [1, 2]
    for epoch in (1, 2):
        steps = [r["step"] for r in got if r.get("epoch") == epoch and "step" in r]
        assert len(steps) >= 10 and steps == sorted(steps) and steps[-1] < got[0]["stepsPerEpoch"]
        last_partial = max(i for i, r in enumerate(got) if r["epoch"] == epoch and "step" in r)
        assert got[last_partial + 1] is next(r for r in got if r["epoch"] == epoch and "step" not in r)
    assert all(np.isfinite(r["loss"]) for r in got)


def test_bar_moves_within_an_epoch_and_keeps_only_epoch_records():
    server = ProgressServer(epochs=2, show=True)
    try:
        server.update({"epoch": 1, "step": 5, "stepsPerEpoch": 20, "loss": 2.0})
        assert server.position == 0.25 and server._bar.n == 0.25 and server.records == []
        server.update({"epoch": 1, "loss": 1.5, "accuracy": 0.5, "samplesPerSecond": 100.0})
        server.update({"epoch": 2, "step": 10, "stepsPerEpoch": 20, "loss": 1.0})
        assert server.position == 1.5 and [r["epoch"] for r in server.records] == [1]
    finally:
        server.close()


def test_partial_records_cross_the_wire():
    server = ProgressServer(epochs=1, show=False)
    client = ProgressClient(server.endpoint())
    try:
        client({"epoch": 1, "step": 3, "stepsPerEpoch": 4, "loss": 1.0})
        client({"epoch": 1, "loss": 0.5})
        client.close()
        deadline = time.monotonic() + 30
        while not server.records and time.monotonic() < deadline:  # the listener thread applies them
            time.sleep(0.01)
        assert server.position == 1.0 and server.records == [{"epoch": 1, "loss": 0.5}]
    finally:
        server.close()
