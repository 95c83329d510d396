"""The export ahead of a job, in a child process: the workers wait for its file and load it, its failure is
reported, it leaves with the driver, and torch in the driver's own threads runs undisturbed meanwhile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import irbis.kernels.engines.export as export_module
from irbis.kernels.engines import EngineError, export_lock_path
from irbis.kernels.export_ahead import _try_lock, export_ahead
from irbis.kernels.inference import clear_cache, make_torch_predict_fn, resolve_source
from irbis.models import build_model

OPTIONS = {"in_features": 64, "hidden": 32, "out_features": 10}


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path / "home"))
    yield
    clear_cache()


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle")
    torch.manual_seed(0)
    net = build_model("mlp", **OPTIONS).eval()
    (folder / "architecture.json").write_text(json.dumps({"architecture": "mlp", "options": OPTIONS}))
    torch.save(net.state_dict(), folder / "weights.pt")
    return folder, net


def _no_export_here(*args, **kwargs):
    raise AssertionError("this process exported the network instead of loading the file written ahead")


@pytest.mark.parametrize("layer,engine,precision", [("0", "auto", "fp32"), (("0", "2"), "torch", "int8")])
def test_the_workers_wait_for_the_file_written_ahead_and_load_it(mlp_bundle, monkeypatch, layer, engine, precision):
    folder, net = mlp_bundle
    source = resolve_source(str(folder))
    ahead = export_ahead(source, [64], output_layer=list(layer) if isinstance(layer, tuple) else layer,
                         engine=engine, precision=precision)  # int8 on torch runs on the export too
    assert _try_lock(export_lock_path(ahead.path)) is None  # held for the child from the start
    monkeypatch.setattr(export_module, "write_onnx", _no_export_here)
    x = np.random.default_rng(1).normal(size=(4, 64)).astype(np.float32)
    out = make_torch_predict_fn(source, engine=engine, precision=precision, output_layer=layer)(x)  # waits
    assert ahead.wait(timeout=120) == ahead.path and ahead.path.exists()
    assert [f for f in ahead.path.parent.glob("*.onnx") if ".int8-" not in f.name] == [ahead.path]
    assert export_ahead(source, [64], output_layer=layer) is None  # written: nothing more to do
    fp32 = make_torch_predict_fn(source, engine="torch", output_layer=layer)(x)
    for got, ref in ([(out[k], fp32[k]) for k in layer] if isinstance(layer, tuple) else [(out, fp32)]):
        assert np.abs(got - ref).max() <= (1e-4 if precision == "fp32" else 0.05) * max(1.0, np.abs(ref).max())
    assert export_ahead(source, [64], engine="torch") is None  # eager first: no file to write


def test_a_failed_export_is_reported_and_the_workers_meet_it_instead_of_waiting(tmp_path, caplog):
    scripted = tmp_path / "net.torchscript"
    torch.jit.script(build_model("mlp", **OPTIONS).eval()).save(str(scripted))
    source = resolve_source(str(scripted))
    ahead = export_ahead(source, [64], engine="onnxruntime")
    with pytest.raises(EngineError, match="export ahead of the job failed: .*TorchScript networks cannot be exported"):
        ahead.wait(timeout=120)
    assert "exporting the network ahead of the job failed" in caplog.text
    assert not ahead.path.exists()
    with pytest.raises(EngineError, match="TorchScript networks cannot be exported"):
        make_torch_predict_fn(source, engine="onnxruntime")(np.zeros((1, 64), np.float32))


def test_an_export_that_cannot_start_is_left_to_the_workers(mlp_bundle, tmp_path, monkeypatch, caplog):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path / "a-file" / "home"))  # a cache folder that cannot be made
    assert export_ahead(resolve_source(str(mlp_bundle[0])), [64], engine="onnxruntime") is None
    assert "cannot export the network ahead of the job" in caplog.text


_DRIVER = """
import json, os, signal, sys
from irbis.kernels.export_ahead import export_ahead
ahead = export_ahead({"kind": "bundle", "path": sys.argv[1]}, [64], engine="onnxruntime")
print(json.dumps([ahead.process.pid, str(ahead.path)]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_export_process_does_not_outlive_its_driver(tmp_path):
    # a network whose loading never ends: only the driver's death can end its export
    (tmp_path / "slow_net.py").write_text(textwrap.dedent("""
        import time
        import torch
        class Slow(torch.nn.Module):
            def __init__(self):
                super().__init__()
                time.sleep(600)
    """))
    bundle = tmp_path / "slow"
    bundle.mkdir()
    (bundle / "architecture.json").write_text(json.dumps({"class": "slow_net:Slow", "options": {}}))
    torch.save({}, bundle / "weights.pt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    driver = subprocess.run([sys.executable, "-c", _DRIVER, str(bundle)], capture_output=True, text=True,
                            env=env, timeout=120)
    assert driver.returncode == -signal.SIGKILL, driver.stderr[-3000:]
    pid, path = json.loads(driver.stdout)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid), "the export process outlived its driver"
    from pathlib import Path

    lock = _try_lock(export_lock_path(Path(path)))  # released with the child
    assert lock is not None
    os.close(lock)
    assert not Path(path).exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_torch_in_the_drivers_threads_runs_undisturbed_while_the_export_runs(mlp_bundle):
    folder, _ = mlp_bundle
    call = torch.nn.Module.__call__
    net = build_model("mlp", **OPTIONS).eval()
    x = torch.randn(3, 64)
    ahead = export_ahead(resolve_source(str(folder)), [64], engine="onnxruntime")
    rounds = 0
    while ahead.running() or rounds == 0:  # for as long as the child exports, at least once
        with torch.inference_mode():
            eager = net(x)
            torch.testing.assert_close(torch.jit.trace(net, x)(x), eager)
            torch.testing.assert_close(torch.jit.script(net)(x), eager)
        assert torch.nn.Module.__call__ is call  # the tracer of torch.export patches it while it runs
        rounds += 1
        time.sleep(0.2)
    assert ahead.wait().exists()


_WORKER = """
import json, sys
import numpy as np
from irbis.kernels.engines import onnx_path
from irbis.kernels.engines.exported import export_key
from irbis.kernels.inference import make_torch_predict_fn, source_identity
source = json.loads(sys.argv[1])  # resolved on the driver, as a job's workers get it
written = onnx_path(export_key(source_identity(source), "0", (64,))).exists()
out = make_torch_predict_fn(source, engine="onnxruntime", output_layer="0")(np.zeros((4, 64), np.float32))
print(json.dumps({"written_before": written, "torch": "torch" in sys.modules, "shape": list(out.shape)}))
"""


def test_a_worker_waits_for_the_file_written_ahead_without_importing_torch(mlp_bundle):
    # A worker that meets the export still running waits on its lock; only a process that must export the
    # network itself needs torch (about 400 MiB and seconds to import in each Python worker).
    folder, _ = mlp_bundle
    source = resolve_source(str(folder))
    ahead = export_ahead(source, [64], output_layer="0", engine="onnxruntime")
    worker = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(source)], capture_output=True, text=True,
                            timeout=180)
    assert ahead.wait(timeout=120) == ahead.path
    assert worker.returncode == 0, worker.stderr[-3000:]
    seen = json.loads(worker.stdout.strip().splitlines()[-1])
    assert seen["written_before"] is False  # it arrived while the child was writing
    assert seen["torch"] is False and seen["shape"][0] == 4
