"""Checkpoints through pyarrow's file systems: a URI run directory (here ``file://``, as ``hdfs://`` or
``s3://`` would be) holds the same files as a local path, and a run resumes from it."""

from __future__ import annotations

import torch

from irbis.train import checkpoint as ckpt


def test_a_uri_run_directory_keeps_one_step_and_reads_back_what_was_saved(tmp_path):
    root = f"file://{tmp_path}/run"
    ckpt.make_run_dir(root)
    assert ckpt.latest(root) is None
    for step in (5, 10):
        for rank in (0, 1):
            ckpt.save_worker(root, step, rank, {"w": torch.full((3,), float(step + rank)), "step": step})
        ckpt.commit(root, step, {"worldSize": 2, "history": [step]})
    assert ckpt.latest(root) == {"worldSize": 2, "history": [10], "step": 10}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["latest.json", "step-000000010"]
    assert sorted(p.name for p in (tmp_path / "run" / "step-000000010").iterdir()) == ["rank-0.pt", "rank-1.pt"]
    back = ckpt.load_worker(root, 10, 1)
    assert torch.equal(back["w"], torch.full((3,), 11.0)) and back["step"] == 10
    # The same directory as a plain path reads the same manifest.
    assert ckpt.latest(str(tmp_path / "run")) == ckpt.latest(root)


def test_resume_through_a_uri_equals_resume_through_a_path(tmp_path):
    import numpy as np
    from sklearn.datasets import load_digits

    from irbis.train.backends.local import run_threads, shard_rows
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec

    x, y = load_digits(return_X_y=True)
    x, y = (x[:200] / 16).astype(np.float32), y[:200]

    def spec(**kw):
        base = dict(network=network_spec("mlp", {"in_features": 64, "hidden": 16, "out_features": 10}),
                    epochs=3, batchSize=16, optimizer="momentum", learningRate=0.05)
        return TrainSpec.of(**{**base, **kw})

    runs = {}
    for name, root in (("path", str(tmp_path / "p")), ("uri", f"file://{tmp_path}/u")):
        run_threads(spec(epochs=2, checkpointDir=root), shard_rows(x, y, 2))
        runs[name] = run_threads(spec(checkpointDir=root), shard_rows(x, y, 2))[0]
    assert runs["uri"].resumed_from is not None and len(runs["uri"].history) == 3
    assert [h["loss"] for h in runs["uri"].history] == [h["loss"] for h in runs["path"].history]
