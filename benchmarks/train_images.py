"""Fine-tuning EfficientNet-Lite0 on JPEG files: Irbis on Spark against plain PyTorch and TorchDistributor.

The files are the demo's camera-trap photographs (:func:`irbis.demo.data.build_camera_trap_set`, 320x240
JPEGs, quality 90), split by camera as the demo splits them (:func:`irbis.demo.dataset.split_by_camera`, a
quarter of the cameras held out): the training files go to ``train/<label>/``, the held-out ones to
``test/<label>/``. The label is 1 for ``animal`` and 0 for ``empty``.

Every side does the same work, measured in the same run:

* the network: :func:`irbis.train.finetune.finetune_network` (the pretrained EfficientNet-Lite0 with a new
  2-class head drawn from seed 0, dropout 0.2), frozen up to ``_blocks.12`` (its BatchNorm statistics
  too): blocks 13-15, the head convolution and the classifier train;
* the optimizer: Adam with its fused kernel (as Irbis builds it), the classifier at 1e-3 and the rest of the
  trainable layers at 1e-4 (ImageClassifier's ``backboneLearningRateFactor`` 0.1), constant rate;
* the data: the same training files, ``EPOCHS`` epochs, global batch 32 (one process x 32, or two x 16);
* the augmentation, drawn per image: random resized crop (scale 0.6-1, ratio 3/4-4/3) to 224x224 (bilinear),
  horizontal flip (p 0.5), brightness and contrast jitter of 0.2 (p 0.5), then (x - 127) / 128;
* the test: every row's final weights scored by one function (decode, the catalogue's resize 256 + centre
  crop 224, forward) on the same held-out files.

Rows:

  (a) plain PyTorch, one process, torch 2 threads: decode (OpenCV), augment (the same ops in
      OpenCV/numpy), forward and backward. Its settings are tuned first on short runs (NCHW or
      channels_last with decoding inline, then decoding in one DataLoader worker in the faster format; each
      with OpenMP's default wait policy and with ``OMP_WAIT_POLICY=PASSIVE``) and the fastest is the row:
      the machine's limit for this work in one process.
  (b) ``TorchDistributor(local_mode=True, num_processes=2, use_gpu=False)``: DDP over gloo, each process
      one torch thread with a torch DataLoader over its half of the files (the same decode and augment);
      its memory format and DataLoader ``num_workers`` (0 or 1) tuned first on short runs, as (a)'s.
  (c) Spark local[2], numWorkers=2: ``ImageClassifier`` and ``TorchEstimator`` (the same network factory,
      ``imagePreprocessing="efficientnet_lite0"``, the same augmentation list and optimizer) on a
      ``read_images`` DataFrame (image structs) and on a ``binaryFile`` DataFrame (the files' bytes).

images/s end to end: training images (files x epochs) over the wall time of the whole call: for (a) from
building the network to the last step, for (b) ``TorchDistributor.run``, for (c) from making the DataFrame
(the file listing) to the fitted model (every Spark job and the Python workers' start; the session itself
is started before the clock). loop images/s: over the training loop's own time (for (c) the slowest
worker's ``loop_seconds``). Memory: the peak of the summed resident memory (RSS, sampled from /proc every
0.25 s) of the processes that do the training: (a) the process and its DataLoader worker, (b) the two
DDP processes and their DataLoader workers, (c) the Spark Python workers; and the largest single process's
peak (``VmHWM``). Then (a), (b) and ImageClassifier once more (on each input) with the training files
repeated 8 times (1 epoch): whether the workers' memory follows the data, and the end-to-end rates once
the fixed costs of a call are spread over more images. The (c) rows keep BatchNorm's running statistics as
training leaves them (``recomputeBatchNorm="never"``), as (a) and (b) do; the default ``"auto"`` would add
a forward pass over up to 50 batches of each worker's rows.

Every row runs in a fresh process (a fresh Spark session for the Spark rows), one after the other.

Usage (the machine has 2 cores: run benchmarks one at a time, under the shared lock)::

    flock /tmp/irbis-bench.lock .venv/bin/python benchmarks/train_images.py   # ~15 min on 2 idle cores
    nice -n 10 .venv/bin/python benchmarks/train_images.py --quick                      # a check that it runs

``--quick``: 32 images, 1 epoch, data grown 2x: nothing is written. A full run writes
``benchmarks/results/train_images.txt``, ``train_images.json`` and ``train_images_loss.png``.
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from provenance import Run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 2
#: The packages whose versions the results files' header names.
PACKAGES = ("torch", "pyspark", "opencv-python-headless", "numpy", "pyarrow")
BACKBONE, FREEZE, DROPOUT, SEED = "efficientnet_lite0", "_blocks.12", 0.2, 0
HEAD_LR, BACKBONE_FACTOR = 1e-3, 0.1
GLOBAL_BATCH = 32
AUGMENTATION = [{"op": "random_resized_crop", "scale": [0.6, 1.0], "ratio": [3 / 4, 4 / 3]},
                {"op": "flip", "flip_code": 1, "p": 0.5},
                {"op": "color_jitter", "brightness": 0.2, "contrast": 0.2, "p": 0.5}]
MEAN, STD, SIZE = 127.0, 128.0, 224
#: (cameras, bursts per camera, frames per burst) of the camera-trap set; a quarter of the cameras are held out.
FULL_SET, QUICK_SET = (16, 8, 4), (4, 4, 2)
EPOCHS, QUICK_EPOCHS = 2, 1
#: Steps timed per setting when tuning (a) and (b), after one untimed one.
TUNE_STEPS = 3
SPARK_CONF = {"spark.ui.enabled": "false"}
# (a) and (b) keep BatchNorm's running statistics as training leaves them; so do the (c) rows (the same work):
# recomputeBatchNorm's default ("auto") adds a forward pass over up to 50 batches of each worker's rows.
RECOMPUTE_BN = "never"


# -- the files -------------------------------------------------------------------------------------------------
def build_files(root: Path, size: tuple[int, int, int], repeats: int) -> dict:
    """The camera-trap set under ``root/set``, hard-linked into ``train/``, ``test/`` and ``train_x{repeats}/``
    (the training files ``repeats`` times) as ``<folder>/<label>/<name>.jpg``."""
    from irbis.demo.data import build_camera_trap_set
    from irbis.demo.dataset import check_labels, load_metadata, split_by_camera

    cameras, bursts, frames = size
    build_camera_trap_set(root / "set", cameras=cameras, bursts_per_camera=bursts, frames_per_burst=frames,
                          seed=SEED)
    meta = load_metadata(root / "set")
    y = check_labels(meta, "animal")
    is_test = split_by_camera(meta, y, seed=SEED)
    folders = {"train": root / "train", "test": root / "test", "grown": root / f"train_x{repeats}"}
    for (_, row), test in zip(meta.iterrows(), is_test):
        name = f"{row['camera']}-{row['burst']}-{Path(row['path']).stem}.jpg"
        copies = [(folders["test"], "")] if test else [(folders["train"], "")] + [
            (folders["grown"], f"r{k}-") for k in range(repeats)]
        for folder, prefix in copies:
            target = folder / row["label"] / f"{prefix}{name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(row["path"], target)
    return {k: str(v) for k, v in folders.items()}


def list_files(folder: str) -> tuple[list[str], np.ndarray]:
    files = sorted(str(p) for p in Path(folder).rglob("*.jpg"))
    return files, np.array([int(Path(f).parent.name == "animal") for f in files], np.int64)


# -- the plain side: decode, augment, network, optimizer -----------------------------------------------------
def plain_augment(rgb: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The augmentation of every side, in OpenCV and numpy: an RGB uint8 image to a float32 CHW input."""
    import cv2

    h, w = rgb.shape[:2]
    lo, hi = math.log(3 / 4), math.log(4 / 3)
    for _ in range(10):  # torchvision's RandomResizedCrop
        target = h * w * rng.uniform(0.6, 1.0)
        ratio = math.exp(rng.uniform(lo, hi))
        cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            break
    else:
        ratio = min(max(w / h, 3 / 4), 4 / 3)
        cw, ch = (w, int(round(w / ratio))) if w / h < ratio else (int(round(h * ratio)), h)
        y, x = (h - ch) // 2, (w - cw) // 2
    img = cv2.resize(rgb[y:y + ch, x:x + cw], (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    out = img.astype(np.float32)
    if rng.random() < 0.5:
        b, c = rng.uniform(0.8, 1.2), rng.uniform(0.8, 1.2)
        out *= np.float32(b)
        mean = out.mean()
        out = np.clip((out - mean) * np.float32(c) + mean, 0, 255).astype(np.uint8).astype(np.float32)
    return np.ascontiguousarray(((out - MEAN) / STD).transpose(2, 0, 1))


class FileSet:
    """A map-style torch dataset over JPEG files; item ``epoch * n + i`` is file ``i`` augmented with draws
    seeded by (seed, epoch, i), so persistent DataLoader workers need no epoch sent to them."""

    def __init__(self, files: list[str], labels: np.ndarray, seed: int = SEED) -> None:
        self.files, self.labels, self.seed = files, labels, seed

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, k: int):
        import cv2

        epoch, i = divmod(int(k), len(self.files))
        with open(self.files[i], "rb") as fh:
            bgr = cv2.imdecode(np.frombuffer(fh.read(), np.uint8), cv2.IMREAD_COLOR)
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        return plain_augment(rgb, np.random.default_rng([self.seed, epoch, i])), int(self.labels[i])


def epoch_items(n: int, epoch: int, rank: int = 0, world: int = 1, seed: int = SEED) -> list[int]:
    """This rank's share of epoch ``epoch``'s seeded permutation, as FileSet items."""
    perm = np.random.default_rng([seed, 99, epoch]).permutation(n)
    return [epoch * n + int(i) for i in perm[rank::world]]


def loader(files: list[str], labels: np.ndarray, items: list[int], batch: int, workers: int):
    import torch

    return torch.utils.data.DataLoader(FileSet(files, labels), batch_size=batch, sampler=items,
                                       num_workers=workers, drop_last=False)


def network(pretrained: bool = True):
    from irbis.train.finetune import finetune_network

    return finetune_network(BACKBONE, 2, FREEZE, SEED, pretrained, DROPOUT)


def adam_groups(params):
    """Adam (its fused kernel, as ImageClassifier's) with ImageClassifier's two rates: the classifier (the last
    two trainable tensors: ``_fc``'s weight and bias) at HEAD_LR, the rest at HEAD_LR * BACKBONE_FACTOR."""
    import torch

    params = list(params)
    return torch.optim.Adam([{"params": params[:-2], "lr": HEAD_LR * BACKBONE_FACTOR},
                             {"params": params[-2:], "lr": HEAD_LR}], fused=True)


def train_steps(model, opt, batches, channels_last: bool, limit: int | None = None, bf16: bool = False):
    """Steps over ``batches`` of (the network's inputs..., labels), the first input made channels-last with
    ``channels_last``, the forward pass and the loss under bf16 autocast with ``bf16``; returns (loss sum,
    rows, steps)."""
    import contextlib

    import torch

    loss_sum, rows, steps = 0.0, 0, 0
    for *xs, yb in batches:
        if channels_last:
            xs[0] = xs[0].contiguous(memory_format=torch.channels_last)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(model(*xs), yb)
        loss.backward()
        opt.step()
        loss_sum += float(loss) * len(yb)
        rows += len(yb)
        steps += 1
        if limit is not None and steps >= limit:
            break
    return loss_sum, rows, steps


def plain_model(channels_last: bool):
    import torch

    torch.manual_seed(SEED)
    model = network().train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, adam_groups(p for p in model.parameters() if p.requires_grad)


def plain_tune(folder: str, steps: int, warm: int = 1) -> dict:
    """(a)'s settings on short runs, images/s over ``steps`` steps after ``warm`` untimed ones: the memory
    format with decoding inline, then decoding in one DataLoader worker with the faster format."""
    import torch

    torch.set_num_threads(2)
    files, labels = list_files(folder)
    out: dict = {}
    for channels_last, workers in ((False, 0), (True, 0), (None, 1)):
        if channels_last is None:
            channels_last = max(out.values(), key=lambda r: r["images_per_s"])["channels_last"]
        model, opt = plain_model(channels_last)
        items = epoch_items(len(files), 0) * (1 + (steps + warm) * GLOBAL_BATCH // len(files))
        batches = iter(loader(files, labels, items, GLOBAL_BATCH, workers))
        train_steps(model, opt, batches, channels_last, warm)
        start = time.perf_counter()
        _, rows, _ = train_steps(model, opt, batches, channels_last, steps)
        passive = os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
        out[_setting({"channels_last": channels_last, "workers": workers, "passive": passive})] = {
            "channels_last": channels_last, "workers": workers, "passive": passive,
            "images_per_s": rows / (time.perf_counter() - start)}
        del batches
    return out


def plain_run(folder: str, epochs: int, channels_last: bool, workers: int, state_path: str) -> dict:
    import torch

    start = clock()
    torch.set_num_threads(2)
    files, labels = list_files(folder)
    model, opt = plain_model(channels_last)
    items = [k for e in range(epochs) for k in epoch_items(len(files), e)]
    curve = []
    t_loop = time.perf_counter()
    for epoch in range(epochs):
        batches = loader(files, labels, epoch_items(len(files), epoch), GLOBAL_BATCH, workers)
        loss_sum, rows, _ = train_steps(model, opt, batches, channels_last)
        curve.append({"epoch": epoch + 1, "loss": loss_sum / rows})
    end = time.perf_counter()
    torch.save(model.state_dict(), state_path)
    return {"seconds": end - start, "loop_seconds": end - t_loop, "images": len(items), "curve": curve}


# -- TorchDistributor -------------------------------------------------------------------------------------------
def td_train(folder: str, epochs: int, workers: int, channels_last: bool, state_path: str,
             limit: int | None = None, warm: int = 1) -> dict:
    """One DDP process of (b): a DataLoader over its half of every epoch's permutation, 16 rows a step."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    files, labels = list_files(folder)
    model, _ = plain_model(channels_last)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = adam_groups(p for p in ddp.parameters() if p.requires_grad)

    def epoch_batches(epoch: int):
        items = epoch_items(len(files), epoch, rank, world)
        if limit is not None:
            items = items * (1 + (limit + warm) * GLOBAL_BATCH // len(files))
        return loader(files, labels, items, GLOBAL_BATCH // world, workers)

    return ddp_loop(model, ddp, opt, epoch_batches, epochs, state_path, limit, warm, channels_last)


def ddp_loop(model, ddp, opt, epoch_batches, epochs: int, state_path: str, limit: int | None = None, warm: int = 1,
             channels_last: bool = False, bf16: bool = False) -> dict:
    """The loop of one DDP process (the process group started): ``epoch_batches(epoch)`` gives this rank's
    batches of an epoch. With ``limit`` (a tuning run), ``warm`` untimed steps then ``limit`` timed ones of epoch
    0; else ``epochs`` epochs, and rank 0 saves ``model``'s weights to ``state_path``; ``bf16``: the steps under
    bf16 autocast (:func:`train_steps`). Ends the process group;
    returns the loop's seconds, the per-epoch loss over every rank and the tuning run's rows/s over every rank."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    curve, timed, rows_timed = [], 0.0, 0
    t_loop = time.perf_counter()
    for epoch in range(epochs if limit is None else 1):
        batches = iter(epoch_batches(epoch))
        if limit is not None:
            train_steps(ddp, opt, batches, channels_last, warm, bf16)
            t0 = time.perf_counter()
            _, rows_timed, _ = train_steps(ddp, opt, batches, channels_last, limit, bf16)
            timed = time.perf_counter() - t0
            del batches
            break
        loss_sum, rows, _ = train_steps(ddp, opt, batches, channels_last, bf16=bf16)
        sums = torch.tensor([loss_sum, float(rows)], dtype=torch.float64)
        dist.all_reduce(sums)
        curve.append({"epoch": epoch + 1, "loss": float(sums[0] / sums[1])})
    loop = time.perf_counter() - t_loop
    if rank == 0 and limit is None:
        torch.save(model.state_dict(), state_path)
    dist.destroy_process_group()
    return {"loop_seconds": loop, "curve": curve, "tune_per_s": world * rows_timed / timed if timed else None}


def td_run(folder: str, epochs: int, workers: int, channels_last: bool, state_path: str,
           limit: int | None = None, warm: int = 1) -> dict:
    from pyspark.ml.torch.distributor import TorchDistributor

    from irbis.spark.session import get_spark

    get_spark("local[2]", app_name="irbis-train-images", **SPARK_CONF).sparkContext.setLogLevel("ERROR")
    files, _ = list_files(folder)
    start = clock()
    out = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
        td_train, folder, epochs, workers, channels_last, state_path, limit, warm)
    seconds = time.perf_counter() - start
    return {**out, "seconds": seconds, "images": epochs * len(files)}


# -- Irbis on Spark ---------------------------------------------------------------------------------------------
def spark_run(folder: str, epochs: int, stage_kind: str, source: str, state_path: str,
              augmentation: list | None = None, cache_frozen: str | None = None) -> dict:
    from functools import partial

    from pyspark.sql import functions as F

    from irbis import read_images
    from irbis.ml import ImageClassifier, TorchEstimator
    from irbis.spark.session import get_spark
    from irbis.train.finetune import finetune_network

    spark = get_spark("local[2]", app_name="irbis-train-images", **SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    files, _ = list_files(folder)
    common = dict(labelCol="label", epochs=epochs, batchSize=GLOBAL_BATCH // 2, numWorkers=2, strategy="sync",
                  augmentation=json.dumps(AUGMENTATION if augmentation is None else augmentation), seed=SEED,
                  showProgress=False,
                  recomputeBatchNorm=RECOMPUTE_BN)
    start = clock()
    if source == "read_images":
        df, col = read_images(folder, spark=spark), "image"
    else:
        df, col = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(folder), "content"
    df = df.withColumn("label", F.col("path").contains("/animal/").cast("int"))
    if stage_kind == "ImageClassifier":
        stage = ImageClassifier(backbone=BACKBONE, imageCol=col, numClasses=2, freezeUntil=FREEZE,
                                optimizer="adam", learningRate=HEAD_LR, backboneLearningRateFactor=BACKBONE_FACTOR,
                                dropout=DROPOUT, **common, **({"cacheFrozen": cache_frozen} if cache_frozen else {}))
    else:
        stage = TorchEstimator(network=partial(finetune_network, BACKBONE, 2, FREEZE, SEED, True, DROPOUT),
                               inputCol=col, imagePreprocessing=BACKBONE, optimizer=adam_groups,
                               learningRate=HEAD_LR, **common)
    model = stage.fit(df)
    seconds = time.perf_counter() - start
    est = stage.last_estimator if stage_kind == "ImageClassifier" else stage
    results = est.last_results[:2]
    import torch

    full = network()  # the trained layers (all of them, or those after the frozen ones) over the pretrained network
    full.load_state_dict(torch.load(io.BytesIO(results[0].state), weights_only=True), strict=False)
    buf = io.BytesIO()
    torch.save(full.state_dict(), buf)
    results = [dataclasses.replace(results[0], state=buf.getvalue()), *results[1:]]
    Path(state_path).write_bytes(results[0].state)
    summary = [{k: v for k, v in r.items() if isinstance(v, (int, float, str)) or v is None}
               for r in model.training_summary]
    epoch_seconds = sum(len(files) / r["samplesPerSecond"] for r in summary if r.get("samplesPerSecond"))
    return {"seconds": seconds, "loop_seconds": max(r.loop_seconds for r in results),
            "read_seconds": max(r.info.get("readSeconds", 0.0) for r in results), "epoch_seconds": epoch_seconds,
            "images": epochs * len(files), "curve": summary,
            "info": [{k: v for k, v in r.info.items() if isinstance(v, (int, float, str))} for r in results]}


# -- memory ------------------------------------------------------------------------------------------------------
def _tree(root: int) -> dict[int, bytes]:
    """The command lines of ``root`` and its descendants."""
    parent, cmd = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    keep, frontier = {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            keep.add(child)
            frontier.append(child)
    for pid in keep:
        try:
            cmd[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            pass
    return cmd


def is_worker(kind: str, pid: int, cmd: bytes) -> bool:
    """Whether a process of this row's tree does its training work (see the module doc)."""
    if kind == "plain":
        return True
    if kind == "spark":
        return b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd
    # TorchDistributor: its DDP processes run the train file under torchrun, and their DataLoader workers
    return (pid != os.getpid() and b"java" not in cmd.split(b" ")[0] and b"torch_run_process_wrapper" not in cmd
            and b"torch.distributed.run" not in cmd and b"pyspark.daemon" not in cmd)


class MemorySampler(threading.Thread):
    """Samples, until stopped, the summed RSS of this row's training processes and each one's peak (VmHWM);
    and the CPU time (user + system) of every process of the row from :meth:`mark` on: this process (less
    the sampler's own), the JVM, the Spark Python workers, the DDP processes, the DataLoader workers."""

    def __init__(self, kind: str, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.kind, self.interval = kind, interval
        self.peak_sum = 0
        self.hwm: dict[int, int] = {}
        self.cpu: dict[int, float] = {}
        self.base: dict[int, float] | None = None
        self.own = 0.0  # the sampler thread's CPU seconds since mark()
        self._stop_event = threading.Event()

    def sample(self) -> None:
        started = time.thread_time()
        total = 0
        tick = os.sysconf("SC_CLK_TCK")
        for pid, cmd in _tree(os.getpid()).items():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                self.cpu[pid] = (int(stat[11]) + int(stat[12])) / tick
                if not is_worker(self.kind, pid, cmd):
                    continue
                status = Path(f"/proc/{pid}/status").read_text()
            except (OSError, IndexError, ValueError):
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if "VmRSS" not in fields:
                continue
            total += int(fields["VmRSS"].split()[0])
            self.hwm[pid] = max(self.hwm.get(pid, 0), int(fields["VmHWM"].split()[0]))
        self.peak_sum = max(self.peak_sum, total)
        if self.base is not None:
            self.own += time.thread_time() - started

    def mark(self) -> None:
        """The row's clock starts: CPU time counts from here."""
        self.sample()
        self.base, self.own = dict(self.cpu), 0.0

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> dict:
        self._stop_event.set()
        self.join()
        self.sample()
        base = self.base or {}
        cpu = sum(v - base.get(pid, 0.0) for pid, v in self.cpu.items()) - self.own
        return {"peak_sum_mib": self.peak_sum / 1024, "largest_mib": max(self.hwm.values(), default=0) / 1024,
                "processes": len(self.hwm), "cpu_seconds": cpu}


#: This process's sampler (the row's child process).
SAMPLER: MemorySampler | None = None


def clock() -> float:
    """The row's clock starts now (and its CPU count): ``time.perf_counter()``."""
    if SAMPLER is not None:
        SAMPLER.mark()
    return time.perf_counter()


# -- evaluation -------------------------------------------------------------------------------------------------
def test_batch(folder: str) -> tuple[np.ndarray, np.ndarray]:
    import cv2

    from irbis.kernels.image.network_input import preprocess_rgb
    from irbis.models import get_entry

    spec = get_entry(BACKBONE).preprocessing
    files, labels = list_files(folder)
    x = np.stack([preprocess_rgb(cv2.cvtColor(cv2.imread(f, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB), spec)
                  for f in files])
    return x, labels


def accuracy(state_path: str, x: np.ndarray, y: np.ndarray) -> float:
    import torch

    torch.set_num_threads(2)
    model = network(pretrained=False)
    model.load_state_dict(torch.load(state_path, weights_only=True))
    model.eval()
    with torch.inference_mode():
        pred = np.concatenate([model(torch.from_numpy(x[i:i + 64])).argmax(1).numpy()
                               for i in range(0, len(x), 64)])
    return float((pred == y).mean())


# -- driver ------------------------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> dict:
    spec = json.loads(args.child)
    kind = spec.pop("kind")
    global SAMPLER
    sampler = SAMPLER = MemorySampler({"plain": "plain", "plain_tune": "plain", "td": "td"}.get(kind, "spark"))
    sampler.start()
    run = {"plain": plain_run, "plain_tune": plain_tune, "td": td_run, "spark": spark_run}[kind]
    out = run(**spec)
    return {"result": out, "memory": sampler.stop()}


def spawn(kind: str, passive: bool = False, script: str = __file__, **spec) -> dict:
    """Run one row in a fresh process (``script --child``: this file's rows, or another benchmark's that reads
    its ``RESULT`` line the same way); ``passive``: with ``OMP_WAIT_POLICY=PASSIVE`` (idle OpenMP threads sleep
    instead of spinning, which pays where other work shares the cores)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]))
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    cmd = [sys.executable, script, "--child", json.dumps({"kind": kind, **spec})]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{kind} {spec} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][7:])


def fmt_ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if reference and value else "-"


def table(rows: list[dict]) -> list[str]:
    a = next((r for r in rows if r["label"].startswith("(a)")), None)
    b = next((r for r in rows if r["label"].startswith("(b)")), None)
    head = (f"{'row':41s} {'img/s e2e':>9s} {'loop':>5s} {'epochs':>6s} {'vs (a)':>6s} {'vs (b)':>6s} "
            f"{'CPU ms/img':>10s} {'vs (a)':>6s} {'vs (b)':>6s} {'test acc':>8s} {'RSS peak MiB':>12s} "
            f"{'largest MiB':>11s} {'e2e s':>6s} {'load':>9s}")
    out = [head, "-" * len(head)]
    for r in rows:
        epochs = f"{r['epochs_rate']:6.1f}" if r.get("epochs_rate") else f"{'-':>6s}"
        cpu = 1e3 * r["memory"]["cpu_seconds"] / r["images"]
        cpu_of = {k: 1e3 * v["memory"]["cpu_seconds"] / v["images"] for k, v in (("a", a), ("b", b)) if v}
        out.append(f"{r['label']:41s} {r['e2e']:9.1f} {r['loop']:5.1f} {epochs} "
                   f"{fmt_ratio(r['e2e'], a and a['e2e']):>6s} "
                   f"{fmt_ratio(r['e2e'], b and b['e2e']):>6s} {cpu:10.0f} {fmt_ratio(cpu_of.get('a'), cpu):>6s} "
                   f"{fmt_ratio(cpu_of.get('b'), cpu):>6s} {r['acc']:8.4f} {r['memory']['peak_sum_mib']:12.0f} "
                   f"{r['memory']['largest_mib']:11.0f} {r['seconds']:6.1f} {r['load'][0]:4.1f}-{r['load'][1]:<4.1f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 images, 1 epoch, data grown 2x; nothing written")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--memory", action="store_true",
                        help="only the memory rows: ImageClassifier at 1x (EPOCHS epochs) and 8x (1 epoch) on each "
                             "input; writes train_images_memory.txt")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    size, repeats = (QUICK_SET, 2) if args.quick else (FULL_SET, 8)
    epochs = args.epochs or (QUICK_EPOCHS if args.quick else EPOCHS)
    run = Run(__file__, packages=PACKAGES)
    root = Path(tempfile.mkdtemp(prefix="irbis-bench-train-images-"))
    try:
        if args.memory:
            report, payload = run_memory(root, size, repeats, epochs)
        else:
            report, payload = run_all(root, size, repeats, epochs, args.quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    header = run.header()
    text = "\n".join([*header, "", *report]) + "\n"
    print(text)
    if args.quick:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.memory:
        (RESULTS / "train_images_memory.txt").write_text(text)
        return
    (RESULTS / "train_images.txt").write_text(text)
    (RESULTS / "train_images.json").write_text(json.dumps({"provenance": header, **payload}, indent=1))
    from irbis.train import plot_loss_curves

    plot_loss_curves({r["label"]: r["curve"] for r in payload["rows"]}, str(RESULTS / "train_images_loss.png"),
                     title=f"EfficientNet-Lite0 on the camera-trap JPEGs, {epochs} epochs: training loss")


def run_memory(root: Path, size: tuple[int, int, int], repeats: int, epochs: int) -> tuple[list[str], dict]:
    """The workers' memory as the data grows: ImageClassifier on each input at 1x and ``repeats``x."""
    folders = build_files(root, size, repeats)
    lines = [f"memory as the training files grow {repeats}x (ImageClassifier, numWorkers=2, local[2]; 1x: "
             f"{len(list_files(folders['train'])[0])} files, {epochs} epochs; {repeats}x: each file repeated, 1 "
             "epoch): the peak of the Spark Python workers' summed RSS, and the largest one's (VmHWM), MiB", "",
             f"  {'input':12s} {'RSS peak 1x':>11s} {f'{repeats}x':>7s} {'ratio':>6s}   {'largest 1x':>10s} "
             f"{f'{repeats}x':>7s} {'ratio':>6s}   {f'{repeats}x img/s e2e':>15s}"]
    out = {}
    for source in ("binaryFile", "read_images"):
        one, grown = (spawn("spark", folder=folders[k], epochs=e, stage_kind="ImageClassifier", source=source,
                            state_path=str(root / "state.pt")) for k, e in (("train", epochs), ("grown", 1)))
        a, b = one["memory"], grown["memory"]
        out[source] = {"one": a, "grown": b}
        lines.append(f"  {source:12s} {a['peak_sum_mib']:11.0f} {b['peak_sum_mib']:7.0f} "
                     f"{b['peak_sum_mib'] / a['peak_sum_mib']:6.2f}   {a['largest_mib']:10.0f} {b['largest_mib']:7.0f} "
                     f"{b['largest_mib'] / a['largest_mib']:6.2f}   "
                     f"{grown['result']['images'] / grown['result']['seconds']:15.1f}")
        print(lines[-1], flush=True)
    return lines, out


def _setting(r: dict) -> str:
    return (f"{'channels_last' if r['channels_last'] else 'NCHW'}, DataLoader num_workers={r['workers']}"
            + (", OMP_WAIT_POLICY=PASSIVE" if r.get("passive") else ""))


def run_all(root: Path, size: tuple[int, int, int], repeats: int, epochs: int, quick: bool) -> tuple[list[str], dict]:
    folders = build_files(root, size, repeats)
    train_files = list_files(folders["train"])[0]
    n_train, n_test = len(train_files), len(list_files(folders["test"])[0])
    mib = sum(Path(f).stat().st_size for f in train_files) / 2**20
    print(f"{n_train} training files ({mib:.1f} MiB), {n_test} test files; {epochs} epochs", flush=True)
    x_test, y_test = test_batch(folders["test"])
    state = str(root / "state.pt")
    rows: list[dict] = []
    steps, warm = (1, 1) if quick else (TUNE_STEPS, 1)

    def loaded(kind: str, **spec) -> dict:
        before = os.getloadavg()[0]
        out = spawn(kind, **spec)
        out["load"] = (before, os.getloadavg()[0])
        return out

    def add(label: str, out: dict) -> None:
        res = out["result"]
        rows.append({"label": label, "seconds": res["seconds"], "e2e": res["images"] / res["seconds"],
                     "images": res["images"], "load": out["load"],
                     "loop": res["images"] / res["loop_seconds"], "read_seconds": res.get("read_seconds"),
                     "loop_seconds": res["loop_seconds"], "info": res.get("info"),
                     "epochs_rate": res["images"] / res["epoch_seconds"] if res.get("epoch_seconds") else None,
                     "acc": accuracy(state, x_test, y_test), "memory": out["memory"], "curve": res["curve"]})
        print(table(rows)[-1], flush=True)

    tune_a = {k: v for passive in (False, True) for k, v in spawn(
        "plain_tune", passive=passive, folder=folders["train"], steps=steps, warm=warm)["result"].items()}
    best_a = max(tune_a.values(), key=lambda r: r["images_per_s"])
    print("(a) tuning:", {k: round(v["images_per_s"], 1) for k, v in tune_a.items()}, flush=True)
    add("(a) plain PyTorch, 1 process x 2 threads",
        loaded("plain", passive=best_a["passive"], folder=folders["train"], epochs=epochs,
              channels_last=best_a["channels_last"], workers=best_a["workers"], state_path=state))
    tune_b: dict = {}
    for channels_last, workers in ((False, 0), (True, 0), (None, 1)):  # as (a)'s tuning
        if channels_last is None:
            channels_last = max(tune_b.values(), key=lambda r: r["images_per_s"])["channels_last"]
        out = spawn("td", folder=folders["train"], epochs=1, workers=workers, channels_last=channels_last,
                    state_path=state, limit=steps, warm=warm)["result"]
        tune_b[_setting({"channels_last": channels_last, "workers": workers})] = {
            "channels_last": channels_last, "workers": workers, "images_per_s": out["tune_per_s"]}
    print("(b) tuning:", {k: round(v["images_per_s"], 1) for k, v in tune_b.items()}, flush=True)
    best_b = max(tune_b.values(), key=lambda r: r["images_per_s"])
    add("(b) TorchDistributor DDP, 2 processes x 1",
        loaded("td", folder=folders["train"], epochs=epochs, workers=best_b["workers"],
              channels_last=best_b["channels_last"], state_path=state))
    for stage in ("ImageClassifier", "TorchEstimator"):
        for source in ("binaryFile", "read_images"):
            add(f"(c) {stage}, {source}",
                loaded("spark", folder=folders["train"], epochs=epochs, stage_kind=stage, source=source,
                      state_path=state))
    grown = []
    base_grown = {"a": loaded("plain", passive=best_a["passive"], folder=folders["grown"], epochs=1,
                              channels_last=best_a["channels_last"], workers=best_a["workers"], state_path=state),
                  "b": loaded("td", folder=folders["grown"], epochs=1, workers=best_b["workers"],
                              channels_last=best_b["channels_last"], state_path=state)}
    for key, out in base_grown.items():
        print(f"({key}) x{repeats}", round(out["result"]["images"] / out["result"]["seconds"], 1), flush=True)
    for source in ("binaryFile", "read_images"):
        out = loaded("spark", folder=folders["grown"], epochs=1, stage_kind="ImageClassifier", source=source,
                     state_path=state)
        one = next(r for r in rows if r["label"] == f"(c) ImageClassifier, {source}")
        grown.append({"source": source, "one": one["memory"], "grown": out["memory"], "load": out["load"],
                      "seconds": out["result"]["seconds"], "images": out["result"]["images"]})
        print(source, f"x{repeats}", out["memory"], flush=True)
    for g in grown:
        for key, out in base_grown.items():
            g[f"e2e_{key}"] = out["result"]["images"] / out["result"]["seconds"]
    return report(rows, grown, tune_a, tune_b, best_a, best_b, dict(
        size=size, n_train=n_train, n_test=n_test, mib=mib, epochs=epochs, repeats=repeats, steps=steps, warm=warm))


def _breakdown(r: dict, images: int) -> str:
    setup = max(i.get("prepareSeconds", 0.0) + i.get("setupSeconds", 0.0) for i in r["info"] or [{}])
    outside = r["seconds"] - r["loop_seconds"] - r["read_seconds"] - setup
    epochs = images / r["epochs_rate"]
    return (f"  {r['label']:34s} e2e {r['seconds']:6.1f} s = outside {outside:5.1f} + read {r['read_seconds']:4.1f} + "
            f"set-up {setup:4.1f} + loop {r['loop_seconds']:6.1f} (epochs {epochs:6.1f}, after them "
            f"{r['loop_seconds'] - epochs:5.1f})")


def report(rows: list[dict], grown: list[dict], tune_a: dict, tune_b: dict, best_a: dict, best_b: dict,
           run: dict) -> tuple[list[str], dict]:
    n_train, repeats, epochs = run["n_train"], run["repeats"], run["epochs"]
    per_image = 3 * SIZE * SIZE * 4
    acc = np.array([r["acc"] for r in rows])
    se = float(np.sqrt(max(acc.mean() * (1 - acc.mean()), 1e-9) / run["n_test"]))
    lines = [
        f"data: the demo's camera-trap JPEGs (irbis.demo.data.build_camera_trap_set, cameras x bursts x frames "
        f"{run['size']}, 320x240, quality 90), split by camera as the demo does: {n_train} training files "
        f"({run['mib']:.1f} MiB), {run['n_test']} held-out test files",
        f"same work on every row: {BACKBONE} pretrained, a new 2-class head (seed {SEED}, dropout {DROPOUT}), frozen "
        f"up to {FREEZE}; Adam (fused), head {HEAD_LR:g}, the other trainable layers {HEAD_LR * BACKBONE_FACTOR:g}; "
        f"{epochs} epochs, global batch {GLOBAL_BATCH} (1 x {GLOBAL_BATCH} or 2 x {GLOBAL_BATCH // 2}); "
        f"augmentation per image: random_resized_crop scale 0.6-1 to {SIZE}, flip p 0.5, brightness/contrast 0.2 "
        "p 0.5",
        f"Spark: local[2] (one torch thread per task), get_spark defaults + {SPARK_CONF}; every row in a fresh "
        "process (and Spark session), one after the other",
        "",
        f"(a) tuned on {run['steps']} steps after {run['warm']} untimed, images/s: " + "; ".join(
            f"{k} {v['images_per_s']:.1f}" for k, v in tune_a.items()) + f"  -> {_setting(best_a)}",
        f"(b) tuned on {run['steps']} steps after {run['warm']} untimed, images/s: " + "; ".join(
            f"{k} {v['images_per_s']:.1f}" for k, v in tune_b.items()) + f"  -> {_setting(best_b)}",
        "", *table(rows), "",
        f"test acc: one held-out image is {100 / run['n_test']:.2f} points; binomial standard error about "
        f"{100 * se:.1f} points",
        "(c) where the end-to-end time goes: e2e s = outside the workers (DataFrame listing, the row check, the "
        "network built on the driver, the shuffle into 2 partitions, Python workers' start and imports) + the "
        "workers' read pass (spill, each image decoded once) + their set-up (profiles gathered and checked, the "
        "network built, the optimizer made: torch's first optimizer imports torch._dynamo) + the loop (the "
        "epochs, then the final weights; recomputeBatchNorm='never' here, as (a) and (b) keep BatchNorm's running "
        "statistics as training leaves them)",
        *[_breakdown(r, n_train * epochs) for r in rows if r["label"].startswith("(c)") and r.get("epochs_rate")],
        "",
        f"memory as the training files grow {repeats}x ({repeats * n_train} files, each repeated; ImageClassifier, "
        f"numWorkers=2; 1x: the {epochs}-epoch row above, {repeats}x: 1 epoch):",
        f"  {'input':12s} {'RSS peak 1x':>11s} {f'{repeats}x':>7s} {'ratio':>6s}   {'largest 1x':>10s} "
        f"{f'{repeats}x':>7s} {'ratio':>6s}   {f'{repeats}x img/s e2e':>15s} {'vs (a)':>6s} {'vs (b)':>6s} "
        f"{'load':>9s}"]
    for g in grown:
        lines.append(f"  {g['source']:12s} {g['one']['peak_sum_mib']:11.0f} {g['grown']['peak_sum_mib']:7.0f} "
                     f"{g['grown']['peak_sum_mib'] / g['one']['peak_sum_mib']:6.2f}   "
                     f"{g['one']['largest_mib']:10.0f} {g['grown']['largest_mib']:7.0f} "
                     f"{g['grown']['largest_mib'] / g['one']['largest_mib']:6.2f}   "
                     f"{g['images'] / g['seconds']:15.1f} {g['images'] / g['seconds'] / g['e2e_a']:5.2f}x "
                     f"{g['images'] / g['seconds'] / g['e2e_b']:5.2f}x {g['load'][0]:4.1f}-{g['load'][1]:<4.1f}")
    lines += [
        f"  a dense in-memory float32 copy of the network inputs (3x{SIZE}x{SIZE}): {n_train * per_image / 2**20:.0f} "
        f"MiB at 1x, {repeats * n_train * per_image / 2**20:.0f} MiB at {repeats}x; the decoded 320x240 RGB uint8 "
        f"pixels: {n_train * 320 * 240 * 3 / 2**20:.0f} MiB at 1x, {repeats * n_train * 320 * 240 * 3 / 2**20:.0f} "
        f"MiB at {repeats}x",
        f"  at {repeats}x, 1 epoch, images/s end to end: (a) {grown[0]['e2e_a']:.1f}, (b) {grown[0]['e2e_b']:.1f} "
        "(the vs columns above): the fixed costs of a call (the Spark jobs before training, the Python workers' "
        "start, torch's imports) spread over more images",
        "",
        "img/s e2e: training images (files x epochs) over the whole call; loop: over the training loop alone (for (c) "
        "the slowest worker's loop_seconds); epochs: over "
        "the epochs alone (training_summary's samplesPerSecond).",
        "CPU ms/img: user + system CPU time of every process of the row (for (c) the driver, the JVM and the Python "
        "workers; for (b) the driver, torchrun and the DDP processes) over the same span as e2e, per training image: "
        "unlike img/s it holds while other work takes cores; its vs columns are (a)'s or (b)'s CPU per image over "
        "the row's (above 1: the row needs less). load: the 1-minute load average when the row started and ended.",
        "RSS peak: the peak of the summed RSS of the processes that train (sampled every 0.25 s: (a) the process and "
        "its DataLoader worker, (b) the DDP processes and their DataLoader workers, (c) the Spark Python workers); "
        "largest: the largest single process's peak (VmHWM).",
        "test acc: each row's final weights on the held-out files, scored by one function (resize 256 bicubic + "
        "centre crop 224, eval mode).",
    ]
    return lines, {"rows": rows, "tune_a": tune_a, "tune_b": tune_b, "grown": grown, **run}


if __name__ == "__main__":
    main()
