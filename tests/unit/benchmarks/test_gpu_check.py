"""``make gpu-check`` keeps working between GPU loans: its script runs here on the CPU (``--quick``), as it will on
the lent machine, where pyspark cannot be imported, and its table holds every row and passed check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import AUGMENTATION  # noqa: E402


def test_the_gpu_check_runs_on_the_cpu_without_spark(tmp_path):
    blocked = tmp_path / "blocked" / "pyspark"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('pyspark cannot be imported on the GPU machine')\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked.parent), str(ROOT)]))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith("# device: cpu")
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["passed"] and all(check["passed"] for check in result["checks"])
    assert result["header"]["device"] == "cpu"

    (tests,) = result["tests"]
    assert tests["name"].startswith("device") and tests["passed"] >= 1 and tests["failed"] == tests["errors"] == 0
    inference = {(r["model"], r["precision"], r["path"].split(",")[0]) for r in result["rows"]
                 if r["part"] == "inference"}
    assert inference == {(model, precision, path) for model in ("efficientnet_lite0", "resnet50")
                         for precision in ("fp32", "bf16") for path in ("plain PyTorch", "Irbis kernel (TorchModel")}
    assert {r["weights"] for r in result["rows"] if r.get("model") == "resnet50"} == {"random (none ship)"}
    tuning = [r for r in result["rows"] if r["part"] == "fine-tuning"]
    assert [r["path"].split(",")[0] for r in tuning] == ["plain PyTorch", "Irbis loop (ImageClassifier's spec",
                                                         "Irbis loop"]  # and with its feeding processes
    assert all(r["images_per_s"] > 0 for r in result["rows"] if "images_per_s" in r)

    names = {check["name"] for check in result["checks"]}
    for model in ("efficientnet_lite0", "resnet50"):
        assert {f"device path: {model} fp32 kernel", f"device path: {model} bf16 kernel",
                f"answers: {model} fp32 kernel on cpu vs plain fp32 on the CPU",
                f"answers: {model} bf16 kernel on cpu vs plain fp32 on the CPU"} <= names
    assert {"device path: fine-tuning step", "no pyspark imported"} <= names
    skipped = {s["part"] for s in result["skipped"]}
    assert "tests marked gpu" in skipped
    assert any(r["part"] == "text" for r in result["rows"])  # the text runner runs without Spark
    text_tuning = [r for r in result["rows"] if r["part"] == "text fine-tuning"]
    assert [r["path"].split(",")[0] for r in text_tuning] == ["plain PyTorch", "plain PyTorch",
                                                              "Irbis loop (TextClassifier's network"]
    assert all(r["texts_per_s"] > 0 and r["waste"] >= 1.0 for r in text_tuning)
    assert {"device path: text fine-tuning step", "text fine-tuning loss is finite"} <= names

    text = (out / "gpu_check.txt").read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# benchmarks/gpu_check.py  ") and lines[0] == result["provenance"][0]
    assert lines[1].startswith("# command: python benchmarks/gpu_check.py --device cpu --quick --out ")
    assert lines[2].endswith("; measuring code: 1")
    assert lines[6] == "# device: cpu: " + result["header"]["card"].split(": ", 1)[1]
    assert "| resnet50 | random (none ship) | bf16 | Irbis kernel" in text and "# result: PASSED" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_missing_cuda_device_fails_the_check_and_says_so(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cuda", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "torch sees no CUDA device" in done.stderr
    assert json.loads((tmp_path / "gpu_check.json").read_text())["passed"] is False
    assert "FAILED before it ran" in (tmp_path / "gpu_check.txt").read_text()


def test_the_fine_tuning_row_trains_with_image_classifiers_default_augmentation():
    from irbis.ml.image_classifier import ImageClassifier

    assert json.loads(ImageClassifier().getAugmentation()) == AUGMENTATION
