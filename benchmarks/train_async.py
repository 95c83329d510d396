"""Benchmark: the parameter-server strategies (downpour, mixed, dcasgd) against synchronous SGD, without Spark.

The end-to-end comparison on Spark, Irbis's asynchronous strategies against sparktorch hogwild, is
``benchmarks/async_e2e.py`` (its own results file); this script's figures are:

* LOOP ONLY, NO SPARK: workers are spawned processes joined by gloo, the parameter-server shards
  co-located in them (or on dedicated server processes) and reached over the ZeroMQ transport
  (:func:`irbis.train.backends.local.run_processes`), so staleness is real even where 4 or 8 workers
  share this machine's cores. No warm-up run. Every run takes the same number of batches (equal
  epochs over the same rows; asynchronous workers share each epoch's batches by speed) and reports:

  - test accuracy after those samples, and loop samples/s: the samples whose gradient reached the model
    (with ``backupWorkers=1`` each step uses ``N - 1`` of the ``N`` batches) over the slowest worker's
    loop time;
  - time to a target training loss (the first epoch whose mean loss is at or below it);
  - the staleness distribution of the server updates (mean, 90th percentile, max);
  - stragglers: 2 workers on the 2 cores (no oversubscription), each strategy with and without rank 0
    slowed 3x (a sleep of twice its compute time each step: the training spec's ``step_hook`` with
    :class:`irbis.train.faults.Stragglers`, for tests and benchmarks): sync's samples/s with and without
    it, and each strategy's gain over sync in both cases, whose ratio is the straggler's share of the gain.
    An epoch of the asynchronous strategies is the job's share of steps, taken by whichever worker is free
    (the straggler takes fewer); a late backup worker skips the steps already made without it;
  - accuracy under staleness: 8 workers over several seeds, each row labelled with its server rule and
    rate (downpour: Adagrad, dcasgd: SGD), and downpour with an SGD server at dcasgd's rate, which differs
    from dcasgd only in the delay compensation (the comparison of the DC-ASGD paper);
  - a worker killed mid-run: ``dcasgd`` with its shards on the driver (``placement="driver"``, here the
    benchmark's process), 4 workers, one of which is killed (SIGKILL) a third of the way through its
    batches and started again, as Spark retries a task; beside the same run without the fault: the
    run time a death costs, the accuracy, and the pushes lost (pushed minus applied, over every epoch).

Workloads: scikit-learn digits (1437 train / 360 test, stratified, random_state=0), inputs X/16, with
the MLP 64-128-10 and with ``small_cnn`` on the digits upscaled to 3x32x32. Every strategy uses plain
SGD, global batch 64 (64 / N per worker), and one cosine schedule (the rate decays per epoch to near
zero): with a constant rate the small CNN's BatchNorm running statistics lag its weights, and its
test accuracy in eval mode swung between 0.15 and 0.98 from one run to the next (sync 0.26, downpour
0.98 after 3 epochs) while the training loss was alike. Every strategy trains on equal samples:
``MLP_EPOCHS`` (30; 20 left even sync at 0.950 on the MLP) and ``CNN_EPOCHS`` (6; 3 were too few
for the running statistics to settle). Synchronous SGD applies one mean gradient per step at
``LR``; an asynchronous worker's push is applied on its own, so N pushes move the weights about as
far as one synchronous step at N times the rate: the asynchronous runs use ``LR / N`` (``mixed``,
which averages groups of 2, ``2 LR / N``). ``downpour`` and ``mixed`` use their default server rule,
Adagrad, at ``2 ADAGRAD_LR / N`` (``mixed``: times its group size), ``dcasgd`` its SGD rule.
``downpour {'placement': 'dedicated'}`` runs the same N workers with the N shards on N extra server
processes instead of inside the workers (co-located); ``dcasgd {'placement': 'driver'}`` with the
shards in the benchmark's own process, which every push and pull then crosses (the price of workers
that can die and rejoin). The two base rates, ``LR`` = 0.4 and
``ADAGRAD_LR`` = 0.02, are the same for every workload and row (each row prints its rate); they
were chosen once by ``--sweep`` (2 workers, MLP, the grid ``SWEEP``), not tuned per row: at 0.2 plain
SGD ended at training loss 0.12 and test accuracy 0.953 (sync and dcasgd), at 0.4 at 0.07 and 0.967.

``--mixed`` runs only ``mixed`` (groups of 2) beside ``downpour`` on the MLP at 2 and 8 workers over the seeds:
the bytes a worker pushes to the shards per step and all it sends per step, and the test accuracy
(``results/train_async_mixed.txt``).

Run: ``python benchmarks/train_async.py [--quick | --sweep | --mixed]``; it prints its own run time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Run  # noqa: E402
from train_sync import CNN, MLP, accuracy, load_digits_split  # noqa: E402

RESULTS = Path(__file__).parent / "results"
LR, ADAGRAD_LR, TARGET_LOSS = 0.4, 0.02, 0.3
# every strategy's rate decays to zero over the run (per epoch): BatchNorm's running statistics then
# settle on the final weights, which a constant rate leaves them lagging (the CNN evaluates with them)
SCHEDULE = {"type": "cosine"}
MLP_EPOCHS, CNN_EPOCHS, SEEDS = 30, 6, 2
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
SWEEP = {"LR": (0.05, 0.1, 0.2, 0.4), "ADAGRAD_LR": (0.01, 0.02, 0.04)}
# dcasgd on the SGD server these results were measured with (its default server rule is Adagrad since the
# study of benchmarks/dcasgd_defaults.py)
DCASGD_SGD = {"serverOptimizer": "sgd"}
ASYNC = {"downpour": {}, "mixed": {"groupSize": 2}, "dcasgd": DCASGD_SGD}
# the same workers, with the shards on one dedicated server process each instead of inside the workers,
# and with the shards in this process (the "driver"), under which a worker that dies rejoins
DEDICATED = ("downpour", {"placement": "dedicated"})
STRAGGLER_RUNS = [("sync", {}), ("downpour", {}), ("mixed", {"groupSize": 2}), ("dcasgd", DCASGD_SGD)]
# the full run's loop-only worker counts (MLP, CNN): each run spawns its processes afresh, which on 2 shared
# cores costs far more than the loop; 4 workers and the CNN beyond 2 were cut to keep the run near 20 minutes
MLP_WORKERS, CNN_WORKERS = [2, 8], [2]
# (strategy, options, what the row compares): downpour's default server rule is Adagrad, dcasgd here SGD; the last
# row is downpour on dcasgd's rule and rate, so that it and dcasgd differ only in the delay compensation
SEED_RUNS = [("sync", {}, "mean gradient, SGD at {lr:g}"), ("downpour", {}, "Adagrad server at {lr:g}"),
             ("dcasgd", DCASGD_SGD, "SGD server at {lr:g}"),
             ("downpour", {"serverOptimizer": "sgd"}, "SGD server at {lr:g}, dcasgd's rule and rate")]
ON_DRIVER = ("dcasgd", {"placement": "driver", **DCASGD_SGD})


def learning_rate(strategy: str, options: dict, workers: int, rates: tuple[float, float] = (LR, ADAGRAD_LR)) -> float:
    """The base rate of ``strategy`` on ``workers`` workers; ``rates`` = (SGD rate, Adagrad rate)."""
    from irbis.train.strategies import make_strategy

    if strategy == "sync":
        return rates[0]
    # the rate follows the server rule the strategy actually runs (mixed's default is Adagrad too)
    adagrad = getattr(make_strategy(strategy, **options), "serverOptimizer", "") == "adagrad"
    base = rates[1] * 2 if adagrad else rates[0]
    return base * options.get("groupSize", 1) / workers


def train(arch: str, options: dict, shape: list[int], data: tuple, epochs: int, strategy: str, sopts: dict,
          workers: int, seed: int = 0, slow: dict | None = None,
          rates: tuple[float, float] = (LR, ADAGRAD_LR), augment: object = None) -> dict:
    from irbis.models import build_model
    from irbis.train.backends.local import run_processes, shard_rows
    from irbis.train.faults import Stragglers
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec

    xtr, xte, ytr, yte = data
    lr = learning_rate(strategy, sopts, workers, rates)
    spec = TrainSpec.of(network=network_spec(arch, options), epochs=epochs, batchSize=64 // workers, optimizer="sgd",
                        learningRate=lr, learningRateSchedule=SCHEDULE, strategy=strategy,
                        strategyOptions=sopts, seed=seed, inputShape=shape, torch_threads=1,
                        step_hook=Stragglers(dict(slow or {})) if slow else None, augment=augment)
    t0 = time.perf_counter()
    results = run_processes(spec, shard_rows(xtr, ytr, workers), retries=1)
    wall = time.perf_counter() - t0
    module = build_model(arch, **options)
    import io

    module.load_state_dict(torch.load(io.BytesIO(results[0].state), weights_only=True))
    hist = results[0].history
    loop = max(r.loop_seconds for r in results[:workers])  # the dedicated servers, if any, train nothing
    elapsed = np.cumsum([len(ytr) / h["samplesPerSecond"] for h in hist])
    reached = [t for h, t in zip(hist, elapsed) if h["loss"] <= TARGET_LOSS]
    stale = np.sum([h["staleness"]["histogram"] for h in hist if h.get("staleness", {}).get("updates")], axis=0)
    return {"strategy": strategy + ("" if not sopts else f" {sopts}"), "workers": workers, "lr": lr,
            "acc": accuracy(module, xte, yte, shape),
            "loop": used_samples(results[:workers], strategy, sopts, spec) / loop,
            "wall": wall,
            "toTarget": reached[0] if reached else float("nan"), "loss": hist[-1]["loss"], "stale": stale,
            "restarts": sum(r.info.get("attempt", 0) for r in results),
            "lost": sum(h["psUpdates"]["pushed"] - h["psUpdates"]["applied"] for h in hist if "psUpdates" in h),
            "pushedBytes": float(np.mean([h.get("pushedBytesPerStep", 0.0) for h in hist])),
            "bytes": float(np.mean([h["bytesPerStep"] for h in hist]))}


def used_samples(results: list, strategy: str, sopts: dict, spec: object) -> int:
    """Samples whose gradient reached the model: every worker's steps (asynchronous workers take unequal
    numbers), and for ``sync`` the steps times the ``N - backupWorkers`` gradients each step uses."""
    steps = [r.info["steps"] for r in results]
    if strategy == "sync":
        return steps[0] * (len(results) - sopts.get("backupWorkers", 0)) * spec.schedule.batchSize
    return sum(steps) * spec.schedule.batchSize


def stale_text(hist: object) -> str:
    if not isinstance(hist, np.ndarray) or hist.size == 0 or hist.sum() == 0:
        return "-"
    from irbis.train.strategies.downpour import staleness_summary

    s = staleness_summary(hist)
    return f"mean {s['mean']:.2f} p90 {s['p90']} max {s['max']}"


def table(title: str, rows: list[dict]) -> str:
    lines = [title, f"{'strategy':34s} {'workers':>7s} {'lr':>7s} {'loop samples/s':>15s} "
                    f"{'s to loss<=%.1f' % TARGET_LOSS:>15s} {'final loss':>10s} {'test acc':>9s}  staleness"]
    for r in rows:
        lines.append(f"{r['strategy']:34s} {r['workers']:7d} {r.get('lr', float('nan')):7.4f} {r['loop']:15,.0f} "
                     f"{r['toTarget']:15.2f} {r['loss']:10.3f} {r['acc']:9.3f}  {stale_text(r['stale'])}")
    return "\n".join(lines)


def workload(arch: str, options: dict, shape: list[int], epochs: int, workers: list[int]) -> list[dict]:
    data = load_digits_split(images=arch != "mlp")
    rows = []
    for n in workers:
        rows.append(train(arch, options, shape, data, epochs, "sync", {}, n))
        for name, sopts in ASYNC.items():
            if n % sopts.get("groupSize", 1) == 0:
                rows.append(train(arch, options, shape, data, epochs, name, sopts, n))
        rows.append(train(arch, options, shape, data, epochs, *DEDICATED, n))
        rows.append(train(arch, options, shape, data, epochs, *ON_DRIVER, n))
    return rows


def fault(epochs: int, workers: int = 4) -> list[str]:
    """``ON_DRIVER`` on the MLP with and without one worker killed a third of the way through its batches."""
    import tempfile

    data = load_digits_split(False)
    steps = -(-len(data[2]) // workers // (64 // workers))  # a worker's batches per epoch
    from irbis.train.faults import kill_once

    with tempfile.TemporaryDirectory() as tmp:
        killer = partial(kill_once, os.path.join(tmp, "killed"), epochs * steps // 3)
        runs = [("no fault", train("mlp", MLP, [64], data, epochs, *ON_DRIVER, workers)),
                ("one worker killed, restarted", train("mlp", MLP, [64], data, epochs, *ON_DRIVER, workers,
                                                       augment=killer))]
    lines = [f"a worker killed mid-run: {ON_DRIVER[0]} {ON_DRIVER[1]}, MLP, {workers} workers, {epochs} epochs",
             f"{'run':30s} {'wall s':>7s} {'restarts':>8s} {'test acc':>9s} {'pushes lost':>11s}"]
    for name, r in runs:
        lines.append(f"{name:30s} {r['wall']:7.1f} {r['restarts']:8d} {r['acc']:9.3f} {r['lost']:11d}")
    return lines


def stragglers(epochs: int, workers: int = 2, factor: float = 3.0) -> list[str]:
    """Every strategy of ``STRAGGLER_RUNS`` with and without rank 0 slowed ``factor`` times (loop only): samples/s,
    test accuracy, and each strategy's speed over sync's in both cases, whose ratio is the straggler's share."""
    data = load_digits_split(False)
    runs = {(name, str(sopts)): [train("mlp", MLP, [64], data, epochs, name, sopts, workers, slow=slow)
                                 for slow in (None, {0: factor})] for name, sopts in STRAGGLER_RUNS}
    sync = runs[("sync", "{}")]
    lines = [f"STRAGGLERS, loop only, no Spark: MLP, {workers} workers on {os.cpu_count()} cores, rank 0 slowed "
             f"{factor:g}x (a sleep of {factor - 1:g}x its compute each step), {epochs} epochs",
             f"{'strategy':24s} {'samples/s (none)':>16s} {'(straggler)':>11s} {'acc (none)':>10s} "
             f"{'(straggler)':>11s} {'gain over sync (none)':>21s} {'(straggler)':>11s} {'straggler share':>15s}"]
    for r, slow in runs.values():
        gain, gain_slow = r["loop"] / sync[0]["loop"], slow["loop"] / sync[1]["loop"]
        lines.append(f"{r['strategy']:24s} {r['loop']:16,.0f} {slow['loop']:11,.0f} {r['acc']:10.3f} "
                     f"{slow['acc']:11.3f} {gain:20.2f}x {gain_slow:10.2f}x {gain_slow / gain:14.2f}x")
    lines.append(f"sync pays the straggler: {sync[0]['loop']:,.0f} samples/s without it, {sync[1]['loop']:,.0f} with "
                 f"it ({sync[1]['loop'] / sync[0]['loop']:.2f}x); straggler share = gain with / gain without")
    return lines


def seeds_table(epochs: int, seeds: int, workers: int) -> list[str]:
    """Test accuracy over seeds at ``workers`` workers, each row labelled with its server rule and rate; the
    last row runs downpour with dcasgd's rule and rate, the same-optimizer comparison of the DC-ASGD paper."""
    data = load_digits_split(False)
    out = [f"accuracy under staleness (loop only, no Spark): MLP, {workers} workers, {epochs} epochs, {seeds} seeds "
           "(mean ± std); each strategy at its own server rule and rate, as in the tables above:"]
    for name, sopts, what in SEED_RUNS:
        lr = learning_rate(name, sopts, workers)
        accs = [train("mlp", MLP, [64], data, epochs, name, sopts, workers, seed=s)["acc"] for s in range(seeds)]
        label = f"{name} ({what.format(lr=lr)})"
        out.append(f"  {label:56s} {np.mean(accs):.4f} ± {np.std(accs):.4f}  {[round(a, 4) for a in accs]}")
    return out


def mixed_bytes(epochs: int, seeds: int, workers: tuple[int, ...] = (2, 8)) -> list[str]:
    """``mixed`` (groups of 2) beside ``downpour`` on the MLP: the bytes each worker pushes to the shards per step
    (``pushedBytesPerStep``), all it sends per step (``bytesPerStep``: its pushes and its group's all-reduce and
    broadcast), and test accuracy over seeds. Before the group all-reduce every member pushed its own gradient
    and the shards formed the group's mean: it pushed what downpour's row pushes."""
    data = load_digits_split(False)
    out = [f"mixed: the group's all-reduce, then its leader alone pushes (MLP, {epochs} epochs, {seeds} seeds, loop "
           "only, no Spark; downpour's pushes are what every mixed worker pushed when the shards reduced the group)",
           f"{'strategy':24s} {'workers':>7s} {'lr':>7s} {'pushed B/step':>13s} {'sent B/step':>11s} "
           f"{'test acc (mean ± std)':>21s}  per seed; staleness"]
    for n in workers:
        for name, sopts in (("downpour", {}), ("mixed", {"groupSize": 2})):
            runs = [train("mlp", MLP, [64], data, epochs, name, sopts, n, seed=s) for s in range(seeds)]
            accs = [r["acc"] for r in runs]
            out.append(f"{runs[0]['strategy']:24s} {n:7d} {runs[0]['lr']:7.4f} {runs[0]['pushedBytes']:13,.0f} "
                       f"{runs[0]['bytes']:11,.0f} {np.mean(accs):12.4f} ± {np.std(accs):.4f}  "
                       f"{[round(a, 4) for a in accs]}; {stale_text(runs[0]['stale'])}")
    return out


def sweep(epochs: int, workers: int = 2) -> list[str]:
    """Test accuracy of each strategy over the grid ``SWEEP`` of base rates (MLP), to choose them once."""
    data, out = load_digits_split(False), [f"sweep: MLP, {workers} workers, {epochs} epochs, test accuracy"]
    for lr in SWEEP["LR"]:
        for ada in SWEEP["ADAGRAD_LR"]:
            accs = {name: train("mlp", MLP, [64], data, epochs, name, sopts, workers, rates=(lr, ada))["acc"]
                    for name, sopts in [("sync", {}), *ASYNC.items()] if workers % sopts.get("groupSize", 1) == 0}
            out.append(f"  LR {lr:<5} ADAGRAD_LR {ada:<5} " + "  ".join(f"{k} {v:.3f}" for k, v in accs.items()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 workers, 1-2 epochs (MLP and CNN): a smoke run")
    parser.add_argument("--sweep", action="store_true", help="the base-rate sweep behind LR and ADAGRAD_LR")
    parser.add_argument("--mixed", action="store_true", help="mixed's bytes pushed per step and accuracy beside "
                                                             "downpour (writes results/train_async_mixed.txt)")
    args = parser.parse_args()
    run = Run(__file__, packages=("torch", "pyzmq", "numpy"))
    if args.mixed:
        lines = mixed_bytes(2 if args.quick else MLP_EPOCHS, 1 if args.quick else SEEDS)
        text = "\n".join([*run.header("workers are processes (gloo + ZeroMQ), one torch thread each"), "", *lines])
        print(text)
        if not args.quick:
            (RESULTS / "train_async_mixed.txt").write_text(text + "\n")
        return
    if args.sweep:
        print("\n".join(sweep(2 if args.quick else MLP_EPOCHS)),
              f"\nrun time {time.perf_counter() - run.started:.0f} s")
        return
    if args.quick:
        mlp, cnn = workload("mlp", MLP, [64], 1, [2]), workload("small_cnn", CNN, [3, 32, 32], 1, [2])
        slow, seeds, faults = stragglers(1), seeds_table(1, 1, 2), fault(3)
    else:
        mlp = workload("mlp", MLP, [64], MLP_EPOCHS, MLP_WORKERS)
        cnn = workload("small_cnn", CNN, [3, 32, 32], CNN_EPOCHS, CNN_WORKERS)
        slow, seeds, faults = stragglers(MLP_EPOCHS), seeds_table(MLP_EPOCHS, SEEDS, 8), fault(MLP_EPOCHS)
    rates = f"base rates LR {LR}, ADAGRAD_LR {ADAGRAD_LR}, {SCHEDULE['type']} schedule"
    loop_only = "LOOP ONLY, NO SPARK (run_processes, no warm-up run): "
    report = [
        *run.header("workers are processes (gloo + ZeroMQ), one torch thread each; the end-to-end comparison "
                    "against sparktorch is benchmarks/async_e2e.py"),
        "", f"loop-only tables: {rates}",
        "", table(loop_only + "digits MLP 64-128-10, global batch 64, equal samples", mlp),
        "", table(loop_only + "small_cnn on 3x32x32 digits, global batch 64, equal samples", cnn),
        "", *slow,
        "", *seeds,
        "", *faults,
    ]
    text = "\n".join(report) + "\n"
    print(text)
    if not args.quick:
        (RESULTS / "train_async.txt").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
