"""Benchmark: DC-ASGD's defaults against Downpour on the same server rule, under mild staleness.

The question: DC-ASGD (SGD server at 0.05) tested 1.5-3 points below Downpour on 4 workers, each strategy
at its own default server rule. Is it the delay compensation (DC-ASGD-a's mean square starts at zero
with no bias correction, so λ is over-estimated in the first updates; or λ0 = 2 too strong for plain
SGD), or the rule? Each cell of the grid (workers x rate) runs every seed with:

* ``downpour sgd``: Downpour with an SGD server, i.e. DC-ASGD with ``lambda_=0``: the reference that
  differs from DC-ASGD only in the delay compensation (the comparison of Zheng et al. 2017), and the
  same run again, which on processes measures how far timing alone moves a run;
* ``dcasgd (lambda_=2)``: the defaults; ``dcasgd lambda_=0.5``: a weaker compensation;
* ``dcasgd bias-corrected``: the mean square divided by ``1 - 0.95^t``
  (``irbis.train.ps.rules.delay_compensate(..., bias_correction=True)``);
* ``downpour adagrad (its default)``: Downpour at its own default rule, Adagrad, at the same rate.

Loop only, no Spark, two backends. PROCESSES: workers are processes joined by gloo, the shards co-located
in them and reached over ZeroMQ, as :func:`irbis.train.backends.local.run_processes` runs them, so the
staleness is that of concurrent workers (about ``N - 1`` updates); they are spawned once and run every
job in turn (a fresh rendezvous store and gloo group per job), since importing torch in fresh processes
costs far more than a job's loop here. THREADS: the thread backend serves the requests in rank order,
the same schedule every run (staleness ``(N - 1) / 2``), so there a difference between two rows is the
rule's alone. Workload: scikit-learn digits (1437 train / 360 test, stratified, random_state=0, inputs
X/16), the MLP 64-128-10, the server rule at a constant rate, batch 16 per worker, 10 epochs.

Run: ``python benchmarks/dcasgd_defaults.py [--quick]``; it writes ``results/dcasgd_defaults.txt``
(not with ``--quick``) and prints its own run time.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_sync import MLP, accuracy, load_digits_split  # noqa: E402

RESULTS = Path(__file__).parent / "results"
EPOCHS, BATCH = 10, 16
WORKERS, RATES, SEEDS = (2, 4), (0.05, 0.1), (0, 1, 2)
# (label, strategy, options, bias-corrected mean square); the first row is each cell's reference
RUNS = [("downpour sgd", "downpour", {"serverOptimizer": "sgd"}, False),
        ("downpour sgd, run again", "downpour", {"serverOptimizer": "sgd"}, False),
        ("dcasgd (lambda_=2)", "dcasgd", {}, False),
        ("dcasgd lambda_=0.5", "dcasgd", {"lambda_": 0.5}, False),
        ("dcasgd bias-corrected", "dcasgd", {}, True),
        ("downpour adagrad (its default)", "downpour", {}, False)]


class _Recorder:
    """The shards' delay compensation, recording how large the correction is against the gradient."""

    def __init__(self, bias_correction: bool) -> None:
        self.bias_correction, self.ratios = bias_correction, []

    def __call__(self, g: np.ndarray, w_now: np.ndarray, w_pulled: np.ndarray, lambda_: float,
                 state: Any = None) -> np.ndarray:
        from irbis.train.ps.rules import delay_compensate

        out = delay_compensate(g, w_now, w_pulled, lambda_, state, bias_correction=self.bias_correction)
        self.ratios.append(float(np.linalg.norm(out - g) / max(float(np.linalg.norm(g)), 1e-12)))
        return out


def _patched(bias_correction: bool) -> _Recorder:
    """Route this process's shards through a fresh :class:`_Recorder`."""
    from irbis.train.ps import shard

    shard.delay_compensate = _Recorder(bias_correction)
    return shard.delay_compensate


def _pool_main(rank: int, jobs: Any, out: Any) -> None:
    """One worker process: run rank ``rank`` of every job it is sent, until it gets None."""
    import torch.distributed as dist

    from irbis.train.comm import connect_store, init_torch_group
    from irbis.train.roles import run_rank

    torch.set_num_threads(1)
    while (job := jobs.get()) is not None:
        spec, shard, workers, port, corrected = job
        try:
            recorder = _patched(corrected)
            store = connect_store("127.0.0.1", port, rank, workers, 120.0)
            comm = init_torch_group(store, rank, workers, "cpu", 120.0)
            try:
                result = run_rank(spec, workers, shard, comm, rank)
            finally:
                dist.destroy_process_group()
            result.info["dcRatios"] = recorder.ratios
            out.put((rank, result))
        except BaseException as err:  # reported, not raised: the pool goes on
            out.put((rank, RuntimeError(f"worker {rank}: {type(err).__name__}: {err}")))


class Pool:
    """``size`` spawned worker processes that run one job's ranks at a time (see the module doc)."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(size)]
        self.procs = [ctx.Process(target=_pool_main, args=(r, q, self.out), daemon=True)
                      for r, q in enumerate(self.jobs)]
        for p in self.procs:
            p.start()

    def run(self, spec: Any, shards: list, corrected: bool = False) -> list:
        from irbis.train.comm import serve_store

        store = serve_store("127.0.0.1", len(shards) + 1, 120.0)
        for rank, shard in enumerate(shards):
            self.jobs[rank].put((spec, shard, len(shards), store.port, corrected))
        results = dict(self.out.get(timeout=600) for _ in shards)
        bad = [r for r in results.values() if isinstance(r, BaseException)]
        if bad:
            raise bad[0]
        return [results[r] for r in sorted(results)]

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)


def _threads(spec: Any, shards: list, corrected: bool = False) -> list:
    """The same job on the thread backend: requests served in rank order, the same schedule every run."""
    from irbis.train.backends.local import run_threads

    recorder = _patched(corrected)
    results = run_threads(spec, shards)
    results[0].info["dcRatios"] = recorder.ratios
    return results


def train(run: Any, data: tuple, strategy: str, options: dict, workers: int, lr: float, seed: int,
          corrected: bool = False, epochs: int = EPOCHS) -> dict:
    """One job through ``run`` (a :class:`Pool`'s ``run`` or :func:`_threads`): test accuracy, the last
    epoch's training loss, the mean staleness of the updates and the mean of ``|compensation| / |g|``."""
    from irbis.models import build_model
    from irbis.train.backends.local import shard_rows
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec
    from irbis.train.strategies.downpour import staleness_summary

    xtr, xte, ytr, yte = data
    spec = TrainSpec(network=network_spec("mlp", MLP), epochs=epochs, batch_size=BATCH, optimizer="sgd",
                     learning_rate=lr, strategy=strategy, strategy_options=options, seed=seed, input_shape=[64],
                     torch_threads=1)
    results = run(spec, shard_rows(xtr, ytr, workers), corrected)
    module = build_model("mlp", **MLP)
    module.load_state_dict(torch.load(io.BytesIO(results[0].state), weights_only=True))
    hist = results[0].history
    stale = np.sum([h["staleness"]["histogram"] for h in hist if h.get("staleness", {}).get("updates")], axis=0)
    ratios = [x for r in results for x in r.info.get("dcRatios", [])]
    return {"acc": accuracy(module, xte, yte, [64]), "loss": hist[-1]["loss"],
            "stale": staleness_summary(stale)["mean"], "dc": float(np.mean(ratios)) if ratios else 0.0}


def grid(run: Any, data: tuple, workers: tuple, rates: tuple, seeds: tuple, epochs: int) -> list[str]:
    lines = [f"{'run':30s} {'workers':>7s} {'lr':>5s} {'staleness':>9s} {'|dc|/|g|':>8s} {'final loss':>10s} "
             f"{'test acc':>8s} {'vs downpour sgd':>15s}  per seed"]
    for n in workers:
        for lr in rates:
            base = None
            for label, strategy, options, corrected in RUNS:
                runs = [train(run, data, strategy, options, n, lr, s, corrected, epochs) for s in seeds]
                accs = np.array([r["acc"] for r in runs])
                base = accs if base is None else base
                lines.append(f"{label:30s} {n:7d} {lr:5g} {np.mean([r['stale'] for r in runs]):9.2f} "
                             f"{np.mean([r['dc'] for r in runs]):8.4f} {np.mean([r['loss'] for r in runs]):10.3f} "
                             f"{accs.mean():8.4f} {(accs - base).mean() * 100:+11.2f} pts  "
                             f"{[round(float(a), 4) for a in accs]}")
            lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 workers, one rate, one seed, 2 epochs: a smoke run")
    args = parser.parse_args()
    t_start, load_before = time.perf_counter(), os.getloadavg()
    data = load_digits_split(False)
    workers, rates, seeds, epochs = ((2,), RATES[:1], SEEDS[:1], 2) if args.quick else (WORKERS, RATES, SEEDS, EPOCHS)
    pool = Pool(max(workers))
    try:
        processes = grid(pool.run, data, workers, rates, seeds, epochs)
    finally:
        pool.close()
    threads = grid(_threads, data, workers, rates, seeds, epochs)
    from irbis.train.strategies import DCASGD

    default = DCASGD()
    text = "\n".join([
        "# benchmarks/dcasgd_defaults.py",
        f"python {platform.python_version()}, torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores; "
        "one torch thread per worker",
        f"load average (1 min) before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}; "
        f"run time {time.perf_counter() - t_start:.0f} s",
        f"digits MLP 64-128-10, server rule at a constant rate, batch {BATCH} per worker, {epochs} epochs, seeds "
        f"{list(seeds)}; dcasgd's defaults: lambda_={default.lambda_:g}, adaptive={default.adaptive}, "
        f"serverOptimizer={default.serverOptimizer!r}",
        "staleness: mean over the updates; |dc|/|g|: mean over the updates of the compensation's norm over the "
        "gradient's; 'vs downpour sgd': mean over the seeds of each seed's test accuracy minus downpour sgd's "
        "(360 test rows: one row is 0.28 pts)",
        "", "PROCESSES (gloo + ZeroMQ, shards co-located): staleness of concurrent workers, timing-dependent",
        *processes,
        "THREADS (requests served in rank order): the same schedule on every run, so a difference is the rule's",
        *threads,
    ])
    print(text)
    if not args.quick:
        (RESULTS / "dcasgd_defaults.txt").write_text(text.rstrip() + "\n")


if __name__ == "__main__":
    sys.exit(main())
