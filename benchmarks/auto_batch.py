"""Benchmark: ``batchSize="auto"`` (automatic minibatch sizing, Seide et al. 2014) against fixed batches.

On the two workloads of ``train_sync.py`` (the digits MLP 64-128-10 and the small CNN on the digits upscaled
to 3x32x32), ``sync`` on 2 workers, momentum SGD with ``lrScaling="linear"`` from a reference batch of 32
(each row gets the rate the rule gives its batch), side by side in one run:

* a fixed batch of 32 per worker;
* every fixed batch of a sweep (16 to 256); the best is the one that reaches the target soonest and ends
  at or above it;
* ``auto`` over the same candidates, searching every epoch and every 5 epochs.

The target is the fixed-32 run's final test accuracy minus 0.5 points. Each row prints the training
loop's wall time and the bytes each worker sent until the first epoch whose test accuracy reaches the
target, the final test accuracy, and the batch sizes used (auto: per epoch, with the rows its trials
computed). The workers run on Irbis's thread backend (the loop every backend runs, one torch thread
each); the test accuracy is measured after every epoch on rank 0's replica and its time is left out.

Run: ``flock /tmp/irbis-bench.lock .venv/bin/python benchmarks/auto_batch.py [--quick]``.
"""
from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import numpy as np
import torch

from provenance import Run
from train_sync import digits_images, load_digits_split  # the same split and inputs as the training benchmark

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SWEEP = (16, 32, 64, 128, 256)
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
MLP = ("mlp", {"in_features": 64, "hidden": 128, "out_features": 10}, [64])
CNN = ("small_cnn", {"num_classes": 10, "width": 32}, [3, 32, 32])
#: name: (architecture, options, input shape, epochs, training rows shifted into 9 copies)
WORKLOADS = {
    "mlp": (*MLP, 20, False),
    "cnn": (*CNN, 6, False),
    "mlp, x9 shifted rows": (*MLP, 8, True),
    "cnn, x9 shifted rows": (*CNN, 3, True),
}


def shifted_digits(images: bool) -> tuple:
    """The digits split with each training image also shifted by one pixel in the 8 directions (zero
    fill; the test rows as they are): 9 times the training rows, so that an epoch is 13 times a search's
    sample rather than 1.4 times."""
    xtr, xte, ytr, yte = load_digits_split(images=False)
    grid = xtr.reshape(-1, 8, 8)
    copies = []
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            moved = np.zeros_like(grid)
            moved[:, max(dy, 0):8 + min(dy, 0), max(dx, 0):8 + min(dx, 0)] = \
                grid[:, max(-dy, 0):8 + min(-dy, 0), max(-dx, 0):8 + min(-dx, 0)]
            copies.append(moved.reshape(len(grid), 64))
    xtr, ytr = np.concatenate(copies), np.tile(ytr, 9)
    return (digits_images(xtr), digits_images(xte), ytr, yte) if images else (xtr, xte, ytr, yte)


def run(workload: str, batch: int | str, data: tuple, epochs: int, seed: int = 0, every: int = 1) -> dict:
    """One fit; returns the per-epoch curve: loop seconds, bytes per worker, test accuracy, batch size."""
    from irbis.models import build_model
    from irbis.train.auto_batch import AutoBatch
    from irbis.train.backends.local import run_threads, shard_rows
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec

    arch, options, shape, _, _ = WORKLOADS[workload]
    xtr, xte, ytr, yte = data
    replicas: dict[int, torch.nn.Module] = {}

    def factory() -> torch.nn.Module:
        module = build_model(arch, **options)
        replicas[threading.get_ident()] = module  # the report runs on rank 0's thread: its own replica
        return module

    test_x = torch.from_numpy(xte).view(len(xte), *shape)
    curve: list[dict] = []
    clock = {"start": 0.0, "eval": 0.0}

    def report(record: dict) -> None:
        if "step" in record:
            return
        t0 = time.perf_counter()
        model = replicas[threading.get_ident()]
        model.eval()
        with torch.no_grad():
            acc = float((model(test_x).argmax(1).numpy() == yte).mean())
        model.train()
        seconds = t0 - clock["start"] - clock["eval"]
        clock["eval"] += time.perf_counter() - t0
        sent = (curve[-1]["bytes"] if curve else 0.0) + record["bytesPerStep"] * steps(record["batchSize"])
        curve.append({"seconds": seconds, "bytes": sent, "accuracy": acc, "batchSize": record["batchSize"],
                      "trialSamples": record.get("trialSamples", 0),
                      "searchSeconds": record.get("searchSeconds", 0.0)})

    def steps(b: int) -> int:
        return -(-((len(ytr) + 1) // 2) // b)

    auto = AutoBatch(SWEEP, every=every) if batch == "auto" else None
    spec = TrainSpec.of(network=network_spec(factory), epochs=epochs, batchSize=SWEEP[0] if auto else int(batch),
                        optimizer="momentum", learningRate=0.05, lrScaling="linear", referenceBatchSize=32,
                        auto_batch=auto, inputShape=shape, seed=seed, torch_threads=1, recomputeBatchNorm="never")
    clock["start"] = time.perf_counter()
    run_threads(spec, shard_rows(xtr, ytr, 2), report=report)
    return {"batch": batch, "curve": curve}


def to_target(curve: list[dict], target: float) -> tuple[float | None, float | None]:
    for point in curve:
        if point["accuracy"] >= target:
            return point["seconds"], point["bytes"]
    return None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the MLP only, 4 epochs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    this_run = Run(__file__, packages=("torch",))
    body = []
    for workload, (arch, _, _, epochs, shifted) in WORKLOADS.items():
        if args.quick and workload != "mlp":
            continue
        epochs = 4 if args.quick else epochs
        images = arch == "small_cnn"
        data = shifted_digits(images) if shifted else load_digits_split(images=images)
        run(workload, 32, data, 1)  # warm-up, untimed
        rows = {b: run(workload, b, data, epochs) for b in SWEEP}
        rows["auto"] = run(workload, "auto", data, epochs)
        rows["auto5"] = run(workload, "auto", data, epochs, every=5)
        target = rows[32]["curve"][-1]["accuracy"] - 0.005
        reached = {b: to_target(r["curve"], target) for b, r in rows.items()}
        fixed = [b for b in SWEEP if reached[b][0] is not None and rows[b]["curve"][-1]["accuracy"] >= target]
        best = min(fixed, key=lambda b: reached[b][0]) if fixed else 32
        body += ["", f"## {workload}: {arch}, {len(data[2])} training rows, {epochs} epochs, "
                     f"target test accuracy {target:.4f} "
                     f"(fixed 32's final {rows[32]['curve'][-1]['accuracy']:.4f} - 0.5 pts)", "",
                 "| row | batch per worker | loop s to target | MB sent per worker to target | final test accuracy "
                 "| loop s, all epochs | trial rows |",
                 "|---|---|---|---|---|---|---|"]
        for name, key in [("fixed 32", 32), (f"best fixed ({best})", best), ("auto", "auto"),
                          ("auto, autoBatchEvery=5", "auto5")] + \
                         [(f"fixed {b}", b) for b in SWEEP if b not in (32, best)]:
            curve = rows[key]["curve"]
            secs, sent = reached[key]
            sizes = [p["batchSize"] for p in curve]
            shown = str(sizes[0]) if len(set(sizes)) == 1 else ",".join(map(str, sizes))
            body.append(f"| {name} | {shown} | {'-' if secs is None else f'{secs:.2f}'} | "
                        f"{'-' if sent is None else f'{sent / 1e6:.2f}'} | {curve[-1]['accuracy']:.4f} | "
                        f"{curve[-1]['seconds']:.2f} | {sum(p['trialSamples'] for p in curve)} |")
        a, b32, bb = reached["auto"][0], reached[32][0], reached[best][0]
        curve_a = rows["auto"]["curve"]
        searched = [p for p in curve_a if p["trialSamples"]]
        trained = len(data[2]) * epochs
        body.append("")
        body.append(f"auto (every epoch): {len(searched)} searches took "
                    f"{sum(p['searchSeconds'] for p in curve_a):.2f} s "
                    f"of the loop's {rows['auto']['curve'][-1]['seconds']:.2f} s; their trials computed "
                    f"{sum(p['trialSamples'] for p in searched)} rows against {trained} rows of training")
        if a is not None and b32 is not None and bb is not None:
            body.append(f"time to target: auto {a:.2f} s, fixed 32 {b32:.2f} s (auto at {b32 / a:.2f}x its speed), "
                        f"best fixed {bb:.2f} s ({bb / a:.2f}x); final accuracy "
                        f"{(rows['auto']['curve'][-1]['accuracy'] - rows[32]['curve'][-1]['accuracy']) * 100:+.2f} "
                        f"pts against fixed 32")
        elif a is None:
            body.append("auto did not reach the target")
        print("\n".join(body[-14:]), flush=True)
    lines = this_run.header("sync on 2 workers (thread backend, one torch thread each), momentum SGD 0.05 at batch 32, "
                            "lrScaling linear (reference 32); auto: candidates " + ", ".join(map(str, SWEEP)) +
                            ", searched every epoch (and every 5) on a sample of up to 512 rows per worker "
                            "(and 128 more to judge on), tolerance 0.05; training goes on from the kept size's trial")
    text = "\n".join(lines + body)
    print(text)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "auto_batch.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
