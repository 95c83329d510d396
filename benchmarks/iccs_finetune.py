"""The seeds' experiment in miniature: a pretrained network fine-tuned on camera-trap images under
synchronous, asynchronous and mixed parameter-server training (after ICCS 2017, which fine-tuned an
ImageNet-pretrained ResNet-50 with random crops and flips run on the CPU while the previous batch trained).

At the scale of this machine: EfficientNet-Lite0 (the pretrained network the catalogue ships; ResNet-50's
weights are not shipped) fine-tuned by ``ImageClassifier`` on the demo's camera-trap JPEGs (binaryFile
bytes, decoded, cropped and flipped in the workers on the prefetch thread), with ``sync``, ``downpour``,
``mixed`` and ``dcasgd`` at 2 and 4 workers on ``local[4]`` (4 workers oversubscribe the 2 cores: the
figures show what staleness costs, not a speed-up). Every cell runs over the same seeds; the table gives
images per second end to end (the fit, Spark job start included) and inside the loop, the test accuracy
(mean and the range over seeds), and the parameter servers' mean staleness. The scaling chart
(``benchmarks/results/iccs_finetune.png``) sits beside the simulator's.

Each row's rate comes from its own sweep, run first: at 2 workers over ``SWEEP_SEEDS`` seeds, each rate of
``RATE_FACTORS`` times the row's base rate trains on the training cameras less a third of them and is scored
on that third (validation cameras; the test cameras are never used to choose). A rate chosen at an edge of
its grid is not trusted: the grid grows past that edge (``async_e2e.sweep_rates``) until the best rate has a
neighbour on each side, at most ``async_e2e.MAX_WIDEN`` times. The table then runs every row at its chosen rate on all
the training cameras.

Run: ``flock /tmp/irbis-bench.lock .venv/bin/python benchmarks/iccs_finetune.py`` (``--quick`` to check it runs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from async_e2e import best_rate, sweep_rates
from provenance import Run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 2
#: Rows: label -> (strategy, optimizer, base rate, strategy options, the rule that applies the update). The
#: parameter servers apply each push with their own rule (serverOptimizer) at the rate: downpour and mixed
#: default to Adagrad (DistBelief's recipe); dcasgd runs on SGD here, as in the DC-ASGD paper, and "downpour,
#: SGD server" pairs with it on the same rule, as the paper compares them. The rate each row runs at comes
#: from its sweep around the base rate.
STRATEGIES = {"sync": ("sync", "adam", 1e-3, "{}", "Adam (workers)"),
              "downpour": ("downpour", "sgd", 0.05, "{}", "Adagrad (server default)"),
              "downpour, SGD server": ("downpour", "sgd", 0.05, '{"serverOptimizer": "sgd"}', "SGD"),
              "mixed": ("mixed", "sgd", 0.05, "{}", "Adagrad (server default)"),
              "dcasgd": ("dcasgd", "sgd", 0.05, '{"serverOptimizer": "sgd"}', "SGD, lambda 2, adaptive")}
#: The sweep's grid: these times each row's base rate, then widened past an edge where the best sits there.
RATE_FACTORS = (1 / 3, 1.0, 3.0)
#: Seeds each rate of the sweep runs over (its validation accuracy is their mean).
SWEEP_SEEDS = 2


def camera_frames(spark, folder: Path, size: tuple[int, int, int], seed: int):
    """The demo's camera-trap set: training and test cameras as binaryFile frames with a 0/1 label."""
    from pyspark.sql import functions as F

    from irbis.demo.data import build_camera_trap_set
    from irbis.demo.dataset import load_metadata

    cameras, bursts, frames = size
    build_camera_trap_set(folder, cameras=cameras, bursts_per_camera=bursts, frames_per_burst=frames, seed=seed)
    meta = load_metadata(folder)
    meta["y"] = (meta["label"] == "animal").astype(int)
    test_cameras = sorted(meta["camera"].unique())[::4]
    meta["is_test"] = meta["camera"].isin(test_cameras)
    labels = spark.createDataFrame(meta[["path", "y", "is_test"]].assign(path=lambda d: "file:" + d["path"]))
    files = spark.read.format("binaryFile").load([f"file:{p}" for p in meta["path"]]).select("path", "content")
    data = files.join(labels, "path").repartition(4).cache()
    data.count()
    return data.where(~F.col("is_test")), data.where(F.col("is_test")), meta


def validation_split(train, meta):
    """The training frame split by camera: every third training camera validates the sweep's rates."""
    from pyspark.sql import functions as F

    cameras = sorted(meta.loc[~meta["is_test"], "camera"].unique())[1::3]
    paths = ["file:" + p for p in meta.loc[meta["camera"].isin(cameras), "path"]]
    held = F.col("path").isin(paths)
    return train.where(~held), train.where(held), len(paths)


def sweep(fit, validation, epochs: int, batch: int, seeds: int, quick: bool) -> tuple[dict[str, float], list[str]]:
    """Each row's chosen rate (2 workers, mean validation accuracy over ``seeds``) and the sweep's lines."""
    chosen, lines = {}, []
    for name, (_, _, base, _, _) in STRATEGIES.items():
        def score(rate: float) -> float:
            return statistics.mean(run_cell(fit, validation, name, 2, seed, epochs, batch, rate)["accuracy"]
                                   for seed in range(seeds))

        tried = sweep_rates(tuple(base * f for f in ((1.0,) if quick else RATE_FACTORS)), score)
        rates = sorted(tried)
        chosen[name] = best_rate(tried)
        edge = len(rates) > 1 and chosen[name] in (rates[0], rates[-1])
        lines.append(f"| {name} | " + ", ".join(f"{lr:.3g}: {tried[lr]:.3f}" for lr in rates)
                     + f" | {chosen[name]:.3g}{' (an edge of its grid)' if edge else ''} |")
        print(lines[-1], flush=True)
    return chosen, lines


def run_cell(train, test, row: str, workers: int, seed: int, epochs: int, batch: int, rate: float) -> dict:
    from irbis.ml import ImageClassifier

    strategy, optimizer, _, options, _ = STRATEGIES[row]
    clf = ImageClassifier(imageCol="content", labelCol="y", numClasses=2, epochs=epochs, batchSize=batch,
                          numWorkers=workers, strategy=strategy, strategyOptions=options, optimizer=optimizer,
                          learningRate=rate, freezeUntil="_blocks.12", seed=seed, showProgress=False,
                          augmentation=json.dumps([{"op": "random_resized_crop", "scale": [0.6, 1.0]},
                                                   {"op": "flip", "flip_code": 1, "p": 0.5}]))
    t0 = time.perf_counter()
    model = clf.fit(train)
    seconds = time.perf_counter() - t0
    images = sum(r.get("samplesPerSecond", 0) > 0 for r in model.training_summary)  # epochs recorded
    scored = model.transform(test).select("y", "prediction").toPandas()
    summary = model.training_summary
    loop = statistics.mean(r["samplesPerSecond"] for r in summary)
    stale = [r["staleness"]["mean"] for r in summary if isinstance(r.get("staleness"), dict)
             and "mean" in r["staleness"]]
    return {"seconds": seconds, "epochs": images, "loop_ips": loop,
            "accuracy": float((scored["y"] == scored["prediction"]).mean()),
            "staleness": statistics.mean(stale) if stale else None,
            "loss": [r["loss"] for r in summary]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name in STRATEGIES:
        mine = sorted((r for r in rows if r["strategy"] == name), key=lambda r: r["workers"])
        a.plot([r["workers"] for r in mine], [r["e2e_ips"] for r in mine], marker="o", label=name)
        b.errorbar([r["workers"] for r in mine], [r["accuracy"] for r in mine],
                   yerr=[[r["accuracy"] - r["acc_lo"] for r in mine], [r["acc_hi"] - r["accuracy"] for r in mine]],
                   marker="o", capsize=3, label=name)
    a.set(xlabel="workers (2 cores)", ylabel="images/s end to end", title="fine-tuning throughput")
    b.set(xlabel="workers (2 cores)", ylabel="test accuracy (mean, range over seeds)", title="accuracy")
    for ax in (a, b):
        ax.set_xticks(sorted({r["workers"] for r in rows}))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--cameras", type=int, default=8, help="cameras of the set (a quarter of them test)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--quick", action="store_true", help="a small set, 1 seed, 1 epoch, 2 workers")
    args = parser.parse_args()
    size, seeds, epochs = (args.cameras, 8, 4), args.seeds, args.epochs
    workers = [int(w) for w in args.workers.split(",")]
    if args.quick:
        size, seeds, epochs, workers = (4, 2, 3), 1, 1, [2]
    from irbis import get_spark

    run = Run(__file__, packages=("torch", "pyspark"))
    spark = get_spark("local[4]", app_name="iccs-finetune", **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        train, test, meta = camera_frames(spark, Path(tmp) / "traps", size, 0)
        n_train = int((~meta["is_test"]).sum())
        rows = []
        # warm-up: workers, imports, the exported network
        run_cell(train, test, "sync", 2, 99, 1, args.batch, STRATEGIES["sync"][2])
        fit, validation, n_val = validation_split(train, meta)
        chosen, sweep_lines = sweep(fit, validation, epochs, args.batch, 1 if args.quick else SWEEP_SEEDS, args.quick)
        for name in STRATEGIES:
            for w in workers:
                cells = [run_cell(train, test, name, w, seed, epochs, args.batch, chosen[name])
                         for seed in range(seeds)]
                accs = [c["accuracy"] for c in cells]
                stale = [c["staleness"] for c in cells if c["staleness"] is not None]
                rows.append({"strategy": name, "rule": f"{STRATEGIES[name][4]} at {chosen[name]:.3g}", "workers": w,
                             "e2e_ips": statistics.median(n_train * epochs / c["seconds"] for c in cells),
                             "loop_ips": statistics.median(c["loop_ips"] for c in cells),
                             "accuracy": statistics.mean(accs), "acc_lo": min(accs), "acc_hi": max(accs),
                             "staleness": statistics.mean(stale) if stale else None})
                print(rows[-1], flush=True)
    lines = [*run.header(f"EfficientNet-Lite0 (pretrained) fine-tuned by ImageClassifier after _blocks.12 on the "
                         f"demo's camera traps ({len(meta)} JPEGs 320x240, {n_train} from the training cameras, the "
                         f"rest test), {epochs} epoch(s), batch {args.batch} per worker, random resized crop + flip in "
                         f"the workers; local[4] on {os.cpu_count()} cores; {seeds} seed(s) per cell; each row names "
                         "the rule that applies its updates (the parameter servers' serverOptimizer at the "
                         "estimator's rate)"),
             "",
             f"rates: each row's own sweep at 2 workers, {epochs} epoch(s), the mean validation accuracy over "
             f"{1 if args.quick else SWEEP_SEEDS} seed(s), training on the training cameras less {n_val} images "
             f"of a third of them, which validate (the test cameras are not used); the grid is {RATE_FACTORS[0]:.3g}, "
             f"1 and {RATE_FACTORS[-1]:.3g} times the row's base rate, widened past an edge where the best sat there",
             "",
             "| strategy | validation accuracy by rate | chosen rate |",
             "|---|---|---|",
             *sweep_lines,
             "",
             "| strategy | update rule | workers | images/s end to end (median) | images/s in the loop "
             "| test accuracy (mean) | range over seeds | mean staleness |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        stale = "-" if r["staleness"] is None else f"{r['staleness']:.2f}"
        lines.append(f"| {r['strategy']} | {r['rule']} | {r['workers']} | {r['e2e_ips']:.1f} | {r['loop_ips']:.1f} | "
                     f"{r['accuracy']:.3f} | {r['acc_lo']:.3f}-{r['acc_hi']:.3f} | {stale} |")
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "iccs_finetune.txt").write_text(text + "\n")
        plot(rows, RESULTS / "iccs_finetune.png")
    spark.stop()



if __name__ == "__main__":
    main()
