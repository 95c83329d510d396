"""Fine-tuning with the frozen layers run once per image: Irbis's ImageClassifier against plain PyTorch.

The work of ``train_images.py`` (EfficientNet-Lite0 frozen up to ``_blocks.12``, a new 2-class head, Adam
with the classifier at 1e-3 and the other trainable layers at 1e-4, global batch 32, the camera-trap JPEGs
split by camera) without augmentation: each file goes through the catalogue's resize 256 + centre crop
224, so the frozen layers' output of a file is the same in every epoch and can be computed once.

Rows, each in a fresh process (a fresh Spark session for the Spark rows), one after the other:

  (a) plain PyTorch, one process, torch 2 threads: the files decoded by OpenCV in 2 threads, then the whole
      network every epoch (channels-last), or the frozen layers once per file (eager, channels-last, no
      gradients, the forward stopped at the last frozen layer) and the epochs over their output;
  (c) ``ImageClassifier`` on a ``binaryFile`` DataFrame, Spark local[2], numWorkers=2:
      ``cacheFrozen='never'`` (the whole network every epoch) and ``'auto'`` (the frozen layers once, by
      ImageFeaturizer's job on the inference engine; the epochs train the layers after them).

Then the frozen-once rows again with the training files repeated ``REPEATS`` times, where a call's fixed
costs (the file listing, Spark's first query, the Python workers' start) weigh less. The Spark rows find
the network's export in the machine's cache when an earlier run made it (as a user's second fit does).

Usage (the machine has 2 cores: run benchmarks one at a time)::

    .venv/bin/python benchmarks/train_images_frozen.py           # about 5 min; writes train_images_frozen.txt
    .venv/bin/python benchmarks/train_images_frozen.py --quick   # 32 images, 1 epoch: a check that it runs
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import train_images as ti  # the files, the network, the optimizer, the Spark row, the rows' processes
from provenance import Run

RESULTS = ti.RESULTS
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
EPOCHS = 4
#: The frozen-once rows run again on the training files repeated this many times.
REPEATS = 4


def plain_frozen(folder: str, epochs: int, once: bool, state_path: str) -> dict:
    """(a): with ``once``, the frozen layers run once per file and the epochs train the layers after them on
    their output; else the whole network runs every epoch."""
    import cv2
    import torch

    from irbis.kernels.image.network_input import preprocess_rgb
    from irbis.models import get_entry
    from irbis.train.finetune import frozen_suffix

    start = ti.clock()
    torch.set_num_threads(2)
    files, labels = ti.list_files(folder)
    model, opt = ti.plain_model(True)
    spec = get_entry(ti.BACKBONE).preprocessing

    def load(f: str) -> np.ndarray:  # OpenCV releases the GIL: two threads decode on the two cores
        return preprocess_rgb(cv2.cvtColor(cv2.imread(f, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB), spec)

    with ThreadPoolExecutor(2) as pool:
        x = torch.from_numpy(np.stack(list(pool.map(load, files))))
    y = torch.from_numpy(labels.astype(np.int64))
    step = model
    if once:
        seen: list = []

        class Enough(Exception):
            """Raised by the hook: the forward stops at the last frozen layer."""

        def keep(module, inputs, output):
            seen.append(output)
            raise Enough

        hook = model.get_submodule(ti.FREEZE).register_forward_hook(keep)
        with torch.no_grad():  # the frozen layers are in eval mode
            for i in range(0, len(x), ti.GLOBAL_BATCH):
                try:
                    model(x[i:i + ti.GLOBAL_BATCH].contiguous(memory_format=torch.channels_last))
                except Enough:
                    pass
        hook.remove()
        x = torch.cat(seen)
        step, _ = frozen_suffix(model, ti.FREEZE)
    curve = []
    t_loop = time.perf_counter()
    for epoch in range(epochs):
        perm = np.random.default_rng([ti.SEED, 99, epoch]).permutation(len(files))
        batches = ((x[perm[i:i + ti.GLOBAL_BATCH]], y[perm[i:i + ti.GLOBAL_BATCH]])
                   for i in range(0, len(files), ti.GLOBAL_BATCH))
        loss_sum, rows, _ = ti.train_steps(step, opt, batches, not once)
        curve.append({"epoch": epoch + 1, "loss": loss_sum / rows})
    end = time.perf_counter()
    torch.save(model.state_dict(), state_path)
    return {"seconds": end - start, "loop_seconds": end - t_loop, "images": epochs * len(files), "curve": curve}


def child(args: argparse.Namespace) -> dict:
    spec = json.loads(args.child)
    kind = spec.pop("kind")
    sampler = ti.SAMPLER = ti.MemorySampler("plain" if kind == "plain_frozen" else "spark")
    sampler.start()
    out = {"plain_frozen": plain_frozen, "spark": ti.spark_run}[kind](**spec)
    return {"result": out, "memory": sampler.stop()}


def run_frozen(root: Path, size: tuple[int, int, int], epochs: int) -> tuple[list[str], dict]:
    folders = ti.build_files(root, size, REPEATS)
    n_train = len(ti.list_files(folders["train"])[0])
    x_test, y_test = ti.test_batch(folders["test"])
    state = str(root / "state.pt")
    once = ("(a) plain PyTorch, frozen layers once (eager)", "plain_frozen", {"once": True})
    auto = ("(c) ImageClassifier, cacheFrozen='auto'", "spark",
            {"stage_kind": "ImageClassifier", "source": "binaryFile", "augmentation": [], "cache_frozen": "auto"})
    rows = []
    for label, kind, spec, folder in (
            ("(a) plain PyTorch, whole network every epoch", "plain_frozen", {"once": False}, "train"),
            (*once, "train"),
            ("(c) ImageClassifier, cacheFrozen='never'", "spark",
             {"stage_kind": "ImageClassifier", "source": "binaryFile", "augmentation": [], "cache_frozen": "never"},
             "train"),
            (*auto, "train"), (*once, "grown"), (*auto, "grown")):
        before = os.getloadavg()[0]
        out = ti.spawn(kind, script=__file__, folder=folders[folder], epochs=epochs, state_path=state, **spec)
        res = out["result"]
        task = max((i.get("taskSeconds", 0.0) for i in res.get("info", [])), default=None)
        rows.append({"label": label, "files": "1x" if folder == "train" else f"{REPEATS}x",
                     "seconds": res["seconds"], "e2e": res["images"] / res["seconds"], "loop": res["loop_seconds"],
                     "task": task, "acc": ti.accuracy(state, x_test, y_test),
                     "loss": [round(c["loss"], 4) for c in res["curve"]],
                     "load": (before, os.getloadavg()[0]), "rss": out["memory"]["peak_sum_mib"]})
        print(rows[-1], flush=True)
    lines = [f"frozen layers once: {ti.BACKBONE} frozen up to {ti.FREEZE}, no augmentation (each file through the "
             f"catalogue's resize 256 + centre crop 224), {n_train} training files ({REPEATS}x: each file "
             f"{REPEATS} times), {epochs} epochs, global batch {ti.GLOBAL_BATCH}, Adam as in train_images.py; "
             "Spark local[2], numWorkers=2, binaryFile; every row in a fresh process",
             "", f"{'row':48s} {'files':>5s} {'img/s e2e':>9s} {'vs whole':>8s} {'vs plain':>8s} {'e2e s':>6s} "
                 f"{'loop s':>6s} {'before s':>8s} {'test acc':>8s} {'RSS MiB':>7s} {'load':>9s}  loss per epoch"]
    for r in rows:
        whole = f"{r['e2e'] / rows[0]['e2e']:7.2f}x" if r["files"] == "1x" else f"{'-':>8s}"
        same = rows[0] if "never" in r["label"] else next(
            q for q in rows if q["label"] == once[0] and q["files"] == r["files"])
        plain = f"{r['e2e'] / same['e2e']:7.2f}x" if r["label"].startswith("(c)") else f"{'-':>8s}"
        before = r["seconds"] - (r["task"] if r["task"] is not None else r["loop"])
        lines.append(f"{r['label']:48s} {r['files']:>5s} {r['e2e']:9.1f} {whole} {plain} "
                     f"{r['seconds']:6.1f} {r['loop']:6.1f} {before:8.1f} {r['acc']:8.4f} {r['rss']:7.0f} "
                     f"{r['load'][0]:4.1f}-{r['load'][1]:<4.1f}  {r['loss']}")
    lines += ["", "img/s e2e: training images (files x epochs) over the whole call, the frozen layers' pass "
              "included (for 'auto': ImageFeaturizer's job on the inference engine). vs whole: over the first "
              "row. vs plain: over the plain row of the same work ('never': the first row; 'auto': the plain "
              "frozen-once row on the same files). loop s: the training loop (Spark: the slowest worker's). "
              "before s: the "
              "rest of the call; for Spark, all before the training tasks: the file listing, Spark's first query "
              "(the numWorkers check), the Python workers' start and, for 'auto', the frozen layers' job. RSS: "
              "the peak of the training processes' summed resident memory (Spark: its Python workers)."]
    return lines, {"rows": rows, "epochs": epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 images, 1 epoch; nothing written")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    run = Run(__file__, packages=ti.PACKAGES)
    root = Path(tempfile.mkdtemp(prefix="irbis-bench-frozen-"))
    try:
        report, _ = run_frozen(root, ti.QUICK_SET if args.quick else ti.FULL_SET, 1 if args.quick else EPOCHS)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = "\n".join([*run.header(), "", *report]) + "\n"
    print(text)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "train_images_frozen.txt").write_text(text)


if __name__ == "__main__":
    main()
