"""Benchmark: distributed training strategies on Spark executors against plain PyTorch and the peers.

Two workloads, each trained for equal epochs with the same global batch:

* digits: scikit-learn handwritten digits (1437 train / 360 test, stratified, random_state=0),
  inputs X/16, MLP 64-128-10, Adam lr 1e-3, 30 epochs, global batch 64 (1 worker x 64 or
  2 workers x 32);
* cnn: the same digits upscaled to 3x32x32 images, ``small_cnn`` (width 32, BatchNorm), a
  compute-bound network, 8 epochs, global batch 64.

For every strategy it prints samples/s end to end (the ``fit`` call) and inside the training loop,
payload bytes per step and worker, and test accuracy; and the 2-worker scaling efficiency
(2-worker loop throughput / (2 x 1-worker loop throughput)). Spark runs local[2]; each worker is
one Spark task with one torch thread.

The peers on the digits MLP are measured in the same run, on the same rows, samples and global batch,
each with Adam at 1e-3 (every side reaches about the same test accuracy there, printed beside it):
plain single-process PyTorch (one thread), sparktorch's synchronous mode (``pip install
'irbis[bench]'``, :mod:`peers`) and ``TorchDistributor(local_mode=True, num_processes=2)`` (DDP over
gloo, in pyspark). A peer that cannot run is printed as "not run" with the reason. Every side gets
one untimed 1-epoch run before its timed one (the output says so).
Run: ``python benchmarks/train_sync.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from provenance import Run

RESULTS = Path(__file__).parent / "results"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
STRATEGIES = {"sync": "{}", "model_averaging": '{"period": 4}', "block_momentum": '{"blockSize": 4}',
              "one_bit": "{}"}
MLP = {"in_features": 64, "hidden": 128, "out_features": 10}
WARM_UP = ("warm-up: every side had one untimed 1-epoch run before its timed one (plain PyTorch; Irbis, one "
           "2-worker sync fit per workload; sparktorch; TorchDistributor)")
CNN = {"num_classes": 10, "width": 32}


def load_digits_split(images: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    if images:
        x = digits_images(x)
    return train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)


def digits_images(x: np.ndarray) -> np.ndarray:
    """Digits rows (N, 64) as the CNN's inputs: upscaled to 32x32, grey in 3 channels, flat (N, 3072)."""
    t = torch.nn.functional.interpolate(torch.from_numpy(x).view(-1, 1, 8, 8), size=32, mode="bilinear")
    return t.repeat(1, 3, 1, 1).reshape(len(x), -1).numpy()


def accuracy(module: torch.nn.Module, x: np.ndarray, y: np.ndarray, shape: list[int]) -> float:
    module.eval()
    with torch.no_grad():
        out = module(torch.from_numpy(x).view(len(x), *shape))
    return float((out.argmax(1).numpy() == y).mean())


def plain_pytorch(arch: str, options: dict, data: tuple, shape: list[int], epochs: int) -> dict:
    from irbis.models import build_model

    xtr, xte, ytr, yte = data
    torch.set_num_threads(1)
    model = build_model(arch, **options).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.from_numpy(xtr).view(len(xtr), *shape), torch.from_numpy(ytr)
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    secs = time.perf_counter() - t0
    n = epochs * len(y)
    return {"mode": "plain PyTorch, 1 thread", "workers": 1, "e2e": n / secs, "loop": n / secs,
            "bytes": 0.0, "acc": accuracy(model, xte, yte, shape)}


def spark_fit(train_df, arch: str, options: dict, data: tuple, shape: list[int], epochs: int, strategy: str,
              workers: int, **params: object) -> tuple[dict, list]:
    """One ``TorchEstimator.fit`` on ``train_df``: its row (samples/s end to end and in the loop, bytes per step,
    accuracy on ``data``'s test half) and training summary. ``params`` override the estimator's Params
    (by default Adam at 1e-3 and ``STRATEGIES``' options)."""
    import io

    from irbis.ml import TorchEstimator
    from irbis.models import build_model

    _, xte, _, yte = data
    settings = {"learningRate": 1e-3, "strategyOptions": STRATEGIES.get(strategy, "{}"), **params}
    est = TorchEstimator(network=arch, networkOptions=json.dumps(options), epochs=epochs,
                         batchSize=64 // workers, numWorkers=workers, strategy=strategy, inputShape=shape,
                         showProgress=False, **settings)
    df = train_df.coalesce(workers) if workers < 2 else train_df
    t0 = time.perf_counter()
    model = est.fit(df)
    secs = time.perf_counter() - t0
    n = epochs * train_df.count()
    module = build_model(arch, **options)
    module.load_state_dict(torch.load(io.BytesIO(est.last_results[0].state), weights_only=True))
    loop = max(r.loop_seconds for r in est.last_results[:workers])
    summary = model.training_summary
    return ({"mode": f"irbis {strategy}", "workers": workers, "e2e": n / secs, "loop": n / loop,
             "bytes": summary[-1].get("bytesPerStep", 0.0), "acc": accuracy(module, xte, yte, shape)}, summary)


def torch_distributor(data: tuple, epochs: int) -> dict:
    """TorchDistributor(local_mode=True, num_processes=2): DDP over gloo under torchrun on the driver, Adam 1e-3,
    32 rows per process; after one untimed 1-epoch run (its warm-up)."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from irbis.models import build_model

    xtr, xte, ytr, yte = data
    TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(_td_train, xtr, ytr, 1)
    t0 = time.perf_counter()
    out = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(_td_train, xtr, ytr, epochs)
    secs = time.perf_counter() - t0
    module = build_model("mlp", **MLP)
    module.load_state_dict({k: torch.tensor(v) for k, v in out["state"].items()})
    n = epochs * len(ytr)
    return {"mode": "TorchDistributor local, DDP", "workers": 2, "e2e": n / secs, "loop": n / out["loop"],
            "bytes": float("nan"), "acc": accuracy(module, xte, yte, [64])}


def sparktorch_sync(df, data: tuple, epochs: int) -> dict:
    """sparktorch's synchronous mode (barrier stage, gloo all-reduce of the mean gradient), Adam 1e-3,
    ``epochs * rows / 64`` iterations of 32 random rows per task; after one untimed 1-epoch run."""
    from irbis.models import build_model
    from peers import sparktorch_fit

    _, xte, ytr, yte = data
    iters = epochs * len(ytr) // 64
    sparktorch_fit(df, build_model("mlp", **MLP), "synchronous", "adam", 1e-3, len(ytr) // 64)
    torch.manual_seed(0)
    module, secs = sparktorch_fit(df, build_model("mlp", **MLP), "synchronous", "adam", 1e-3, iters)
    return {"mode": "sparktorch synchronous", "workers": 2, "e2e": iters * 64 / secs, "loop": float("nan"),
            "bytes": float("nan"), "acc": accuracy(module, xte, yte, [64])}


def peer_rows(df, data: tuple, epochs: int) -> tuple[list[dict], list[str]]:
    """The measured peers' rows on the digits MLP, and a "not run" line for each that could not run."""
    from peers import not_run

    rows, missing = [], []
    for name, run in (("sparktorch synchronous", lambda: sparktorch_sync(df, data, epochs)),
                      ("TorchDistributor local", lambda: torch_distributor(data, epochs))):
        try:
            rows.append(run())
        except Exception as err:  # noqa: BLE001 - a peer that does not run here is reported, not hidden
            missing.append(not_run(name, err))
        print(rows[-1] if rows else missing[-1], flush=True)
    return rows, missing


def _td_train(xtr, ytr, epochs):
    import time

    import torch
    import torch.distributed as dist

    from irbis.models import build_model

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(build_model("mlp", in_features=64, hidden=128,
                                                                  out_features=10).train())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.from_numpy(xtr[rank::world]), torch.from_numpy(ytr[rank::world])
    g = torch.Generator().manual_seed(rank)
    t0 = time.perf_counter()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    loop = time.perf_counter() - t0
    state = {k: v.tolist() for k, v in model.module.state_dict().items()}
    dist.destroy_process_group()
    # Every rank returns its (identical, DDP-synchronised) weights: which rank's value run() hands back
    # is not something to rely on.
    return {"state": state, "loop": loop}


def table(title: str, rows: list[dict]) -> str:
    lines = [title, f"{'mode':34s} {'workers':>7s} {'e2e samples/s':>14s} {'loop samples/s':>15s} "
                    f"{'bytes/step':>11s} {'test acc':>9s}"]
    for r in rows:
        lines.append(f"{r['mode']:34s} {r['workers']:7d} {r['e2e']:14,.0f} {r['loop']:15,.0f} "
                     f"{r['bytes']:11,.0f} {r['acc']:9.4f}")
    return "\n".join(lines)


def workload(spark, name: str, arch: str, options: dict, shape: list[int], epochs: int, strategies: list[str],
             curves: dict) -> list[dict]:
    """Plain PyTorch and every strategy at 1 and 2 workers, each after one untimed 1-epoch run of its kind
    (one 2-worker sync fit warms the Spark Python workers for all of Irbis's rows)."""
    from peers import digits_frame

    data = load_digits_split(images=arch != "mlp")
    xtr, _, ytr, _ = data
    df = digits_frame(spark, xtr, ytr)
    plain_pytorch(arch, options, data, shape, 1)
    rows = [plain_pytorch(arch, options, data, shape, epochs)]
    spark_fit(df, arch, options, data, shape, 1, "sync", 2)
    for strategy in strategies:
        for workers in (1, 2):
            row, summary = spark_fit(df, arch, options, data, shape, epochs, strategy, workers)
            rows.append(row)
            if workers == 2:
                curves[f"{name} {strategy}"] = summary
            print(row, flush=True)
    df.unpersist()
    return rows


def accuracy_over_seeds(epochs: int, seeds: int = 5) -> list[str]:
    """Test accuracy of every strategy over several seeds (2 workers as threads, same loop as on Spark).

    One run's accuracy on 360 test digits moves by a few samples from seed to seed (one sample is
    0.28 points), so the strategies are compared on the mean over seeds.
    """
    import io

    from irbis.models import build_model
    from irbis.train.backends.local import run_threads, shard_rows
    from irbis.train.loop import TrainSpec

    xtr, xte, ytr, yte = load_digits_split(images=False)
    torch.set_num_threads(1)
    out = [f"test accuracy over {seeds} seeds (digits MLP, {epochs} epochs, 2 workers x batch 32, thread backend):"]
    for strategy, options in STRATEGIES.items():
        accs = []
        for seed in range(seeds):
            spec = TrainSpec.of(network={"kind": "architecture", "name": "mlp", "options": MLP}, epochs=epochs,
                                batchSize=32, strategy=strategy, strategyOptions=json.loads(options), seed=seed)
            result = run_threads(spec, shard_rows(xtr, ytr, 2))[0]
            module = build_model("mlp", **MLP)
            module.load_state_dict(torch.load(io.BytesIO(result.state), weights_only=True))
            accs.append(accuracy(module, xte, yte, [64]))
        out.append(f"  {strategy:16s} mean {np.mean(accs):.4f}  std {np.std(accs):.4f}  "
                   f"min {min(accs):.4f}  max {max(accs):.4f}")
    return out


def efficiency(rows: list[dict]) -> list[str]:
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows if r["mode"].startswith("irbis")):
        one = next(r for r in rows if r["mode"] == mode and r["workers"] == 1)
        two = next(r for r in rows if r["mode"] == mode and r["workers"] == 2)
        out.append(f"  {mode:24s} loop {two['loop'] / (2 * one['loop']):.2f}   end to end "
                   f"{two['e2e'] / (2 * one['e2e']):.2f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer epochs (a smoke run)")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from irbis.spark.session import get_spark
    from irbis.train import plot_loss_curves

    run = Run(__file__, packages=("torch", "pyspark", "sparktorch", "numpy", "pyarrow"))
    spark = get_spark("local[2]", app_name="irbis-train-bench", **{"spark.ui.enabled": "false",
                                                                    "spark.sql.shuffle.partitions": "2"})
    curves: dict = {}
    digits_epochs, cnn_epochs = (5, 1) if args.quick else (30, 8)
    digits = workload(spark, "digits", "mlp", MLP, [64], digits_epochs, list(STRATEGIES), curves)
    from peers import digits_frame

    data = load_digits_split(False)
    df = digits_frame(spark, data[0], data[2])
    measured, missing = peer_rows(df, data, digits_epochs)
    digits += measured
    df.unpersist()
    cnn = workload(spark, "cnn", "small_cnn", CNN, [3, 32, 32], cnn_epochs, list(STRATEGIES), curves)
    spark.stop()
    seeds = accuracy_over_seeds(digits_epochs, seeds=2 if args.quick else 5)
    report = [
        *run.header("Spark local[2], one torch thread per task", WARM_UP),
        "", table(f"digits: MLP 64-128-10, {digits_epochs} epochs, global batch 64", digits),
        *[f"  {line}" for line in missing],
        "every row in this table was measured in this run" + ("" if not missing else
                                                              "; the peers named above did not run"),
        "scaling efficiency, 2 workers vs 1:", *efficiency(digits),
        "", *seeds,
        "", table(f"cnn: small_cnn on 3x32x32 digits, {cnn_epochs} epochs, global batch 64", cnn),
        "scaling efficiency, 2 workers vs 1:", *efficiency(cnn),
        "", "loop samples/s: samples over the training loop's own time (nan where a peer reports none); "
        "e2e: over the whole fit/run call.",
        "bytes/step: payload bytes each worker hands to collectives per step, counted by the communicator.",
    ]
    text = "\n".join(report) + "\n"
    print(text)
    if not args.quick:
        (RESULTS / "train_sync.txt").write_text(text)
        plot_loss_curves(curves, str(RESULTS / "train_sync_loss.png"), title="training loss, 2 workers")


if __name__ == "__main__":
    sys.exit(main())
