"""Benchmark: DC-ASGD's defaults against Downpour's, and DC-ASGD against ASGD on the same server rule.

The question: DC-ASGD on an SGD server at 0.05 tested 1.5-3 points below Downpour on 4 workers, each
strategy at its own default server rule (then SGD and Adagrad). Is it the delay compensation (DC-ASGD-a's
mean square starts at zero with no bias correction, so λ is over-estimated in the first updates; or
λ0 = 2 too strong for plain SGD), or the rule? Two parts:

PROCESSES, the suspects, on the digits MLP: workers are processes joined by gloo, the shards co-located in
them and reached over ZeroMQ, as :func:`irbis.train.backends.local.run_processes` runs them, so the
staleness is that of concurrent workers (about ``N - 1`` updates); they are spawned once and run every
job in turn (a fresh rendezvous store and gloo group per job), since importing torch in fresh processes
costs far more than a job's loop here. Each cell (workers x rate) runs every seed with:

* ``downpour sgd``: Downpour with an SGD server, i.e. DC-ASGD with ``lambda_=0``: the reference that
  differs from DC-ASGD on SGD only in the delay compensation (the comparison of Zheng et al. 2017), and
  the same run again, which measures how far timing alone moves a run;
* ``dcasgd sgd (lambda_=2)``; ``dcasgd sgd lambda_=0.5``: a weaker compensation; ``dcasgd sgd
  bias-corrected``: the mean square divided by ``1 - 0.95^t``
  (``irbis.train.ps.rules.delay_compensate(..., bias_correction=True)``);
* ``downpour adagrad (its default)`` and ``dcasgd adagrad (its default)``.

THREADS, the sweep, on the digits MLP (10 epochs) and the small CNN (width 16, 3 epochs): the thread
backend serves the requests in rank order, the same schedule every run (staleness ``(N - 1) / 2``), so a
difference between two rows is the rule's alone. DC-ASGD and Downpour on an SGD and on an Adagrad server,
at 2, 4 and 8 workers and every rate of the sweep, 3 seeds each; each row's best rate, the pairings at
their own best rates, and dcasgd's default against downpour's default at each rate.

Workload: scikit-learn digits (1437 train / 360 test, stratified, random_state=0, inputs X/16; the CNN's
upscaled to 3x32x32), the server rule at a constant rate, batch 16 per worker.

RECURRENT (``--recurrent``, threads): the LSTM over variable-length rows of the recurrent strategy tests
(does token 7 occur in a row of 3-40 tokens; ``lstm_classifier`` 20-8-16, packed rows under a token budget
of 1024, 2 workers, batch 16, 6 epochs, 320 rows of which a quarter validate): ``sync`` with the local Adam
at each rate, ``dcasgd`` on each server rule at each rate, and ``dcasgd``'s λ on its default rule. The
question: which of dcasgd's rate, server rule and λ leaves it below sync there. It writes
``results/dcasgd_recurrent.txt``.

Run: ``python benchmarks/dcasgd_defaults.py [--quick | --recurrent]``; it writes
``results/dcasgd_defaults.txt`` (not with ``--quick``) and prints its own run time.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Run  # noqa: E402
from train_sync import MLP, accuracy, load_digits_split  # noqa: E402

RESULTS = Path(__file__).parent / "results"
EPOCHS, BATCH = 10, 16
WORKERS, RATES, SEEDS = (2, 4), (0.05, 0.1), (0, 1, 2)
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
# (label, strategy, options, bias-corrected mean square); the first row is each cell's reference
RUNS = [("downpour sgd", "downpour", {"serverOptimizer": "sgd"}, False),
        ("downpour sgd, run again", "downpour", {"serverOptimizer": "sgd"}, False),
        ("dcasgd sgd (lambda_=2)", "dcasgd", {"serverOptimizer": "sgd"}, False),
        ("dcasgd sgd lambda_=0.5", "dcasgd", {"serverOptimizer": "sgd", "lambda_": 0.5}, False),
        ("dcasgd sgd bias-corrected", "dcasgd", {"serverOptimizer": "sgd"}, True),
        ("downpour adagrad (its default)", "downpour", {}, False),
        ("dcasgd adagrad (its default)", "dcasgd", {}, False)]
# The sweep (threads): each strategy on each server rule, at every rate; the cells' own best rates
SWEEP_RUNS = [("downpour sgd", "downpour", {"serverOptimizer": "sgd"}),
              ("dcasgd sgd", "dcasgd", {"serverOptimizer": "sgd"}),
              ("downpour adagrad", "downpour", {"serverOptimizer": "adagrad"}),
              ("dcasgd adagrad", "dcasgd", {"serverOptimizer": "adagrad"})]
SWEEP_WORKERS, SWEEP_RATES = (2, 4, 8), (0.01, 0.03, 0.1)
#: workload: (architecture, options, input shape, epochs)
WORKLOADS = {"mlp": ("mlp", MLP, [64], EPOCHS), "cnn": ("small_cnn", {"num_classes": 10, "width": 16}, [3, 32, 32], 3)}


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
          corrected: bool = False, epochs: int = EPOCHS, workload: str = "mlp") -> dict:
    """One job through ``run`` (a :class:`Pool`'s ``run`` or :func:`_threads`): test accuracy, the last
    epoch's training loss, the mean staleness of the updates and the mean of ``|compensation| / |g|``."""
    from irbis.models import build_model
    from irbis.train.backends.local import shard_rows
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec
    from irbis.train.strategies.downpour import staleness_summary

    xtr, xte, ytr, yte = data
    arch, arch_options, shape, _ = WORKLOADS[workload]
    spec = TrainSpec.of(network=network_spec(arch, arch_options), epochs=epochs, batchSize=BATCH, optimizer="sgd",
                        learningRate=lr, strategy=strategy, strategyOptions=options, seed=seed, inputShape=shape,
                        torch_threads=1)
    results = run(spec, shard_rows(xtr, ytr, workers), corrected)
    module = build_model(arch, **arch_options)
    module.load_state_dict(torch.load(io.BytesIO(results[0].state), weights_only=True))
    hist = results[0].history
    stale = np.sum([h["staleness"]["histogram"] for h in hist if h.get("staleness", {}).get("updates")], axis=0)
    ratios = [x for r in results for x in r.info.get("dcRatios", [])]
    return {"acc": accuracy(module, xte, yte, shape), "loss": hist[-1]["loss"],
            "stale": staleness_summary(stale)["mean"], "dc": float(np.mean(ratios)) if ratios else 0.0}


def grid(run: Any, data: tuple, workers: tuple, rates: tuple, seeds: tuple, epochs: int) -> list[str]:
    lines = [f"{'run':32s} {'workers':>7s} {'lr':>5s} {'staleness':>9s} {'|dc|/|g|':>8s} {'final loss':>10s} "
             f"{'test acc':>8s} {'vs downpour sgd':>15s}  per seed"]
    for n in workers:
        for lr in rates:
            base = None
            for label, strategy, options, corrected in RUNS:
                runs = [train(run, data, strategy, options, n, lr, s, corrected, epochs) for s in seeds]
                accs = np.array([r["acc"] for r in runs])
                base = accs if base is None else base
                lines.append(f"{label:32s} {n:7d} {lr:5g} {np.mean([r['stale'] for r in runs]):9.2f} "
                             f"{np.mean([r['dc'] for r in runs]):8.4f} {np.mean([r['loss'] for r in runs]):10.3f} "
                             f"{accs.mean():8.4f} {(accs - base).mean() * 100:+11.2f} pts  "
                             f"{[round(float(a), 4) for a in accs]}")
            lines.append("")
    return lines


def sweep(workload: str, data: tuple, workers: tuple, rates: tuple, seeds: tuple, epochs: int) -> list[str]:
    """Threads: every row of :data:`SWEEP_RUNS` at every rate, mean test accuracy over the seeds; then each
    row's best rate, the pairings at their best rates, and dcasgd's default against downpour's default at
    each rate."""
    from irbis.train.strategies import DCASGD, Downpour

    dc_default, dp_default = DCASGD().serverOptimizer, Downpour().serverOptimizer
    head = f"{'run':18s} {'workers':>7s} " + " ".join(f"{'lr ' + format(r, 'g'):>9s}" for r in rates) + \
        f"  {'best lr':>7s} {'best acc':>8s}"
    lines = [head]
    worst: list[tuple[float, int, float]] = []
    for n in workers:
        acc: dict[str, list[float]] = {}
        for label, strategy, options in SWEEP_RUNS:
            acc[label] = [float(np.mean([train(_threads, data, strategy, options, n, lr, s, False, epochs,
                                               workload)["acc"] for s in seeds])) for lr in rates]
            best = int(np.argmax(acc[label]))
            lines.append(f"{label:18s} {n:7d} " + " ".join(f"{a:9.4f}" for a in acc[label]) +
                         f"  {rates[best]:7g} {acc[label][best]:8.4f}")
        pair = [f"dcasgd - downpour at each one's best rate: sgd "
                f"{(max(acc['dcasgd sgd']) - max(acc['downpour sgd'])) * 100:+.2f} pts, adagrad "
                f"{(max(acc['dcasgd adagrad']) - max(acc['downpour adagrad'])) * 100:+.2f} pts"]
        gaps = [(a - b) * 100 for a, b in zip(acc[f"dcasgd {dc_default}"], acc[f"downpour {dp_default}"])]
        worst += [(g, n, r) for g, r in zip(gaps, rates)]
        pair.append(f"defaults (dcasgd {dc_default} - downpour {dp_default}) at the same rate: " +
                    ", ".join(f"{g:+.2f}" for g in gaps) + " pts")
        lines += [f"  {p}" for p in pair] + [""]
    g, n, r = min(worst)
    lines.append(f"{workload}: dcasgd's default at most {-g:.2f} pts below downpour's default at the same rate "
                 f"(worst cell: {n} workers, lr {r:g})" if g < 0 else
                 f"{workload}: dcasgd's default is never below downpour's default at the same rate")
    return lines


RECURRENT_RATES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
RECURRENT_RULES = ("adagrad", "sgd", "momentum", "rmsprop")
RECURRENT_LAMBDAS = (0.0, 0.5, 2.0, 8.0)


def recurrent(seeds: tuple, epochs: int = 6) -> list[str]:
    """Threads: validation accuracy of the LSTM task after ``epochs``, mean over ``seeds``, per rate."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "train"))
    from irbis.train.backends.local import run_threads, shard_rows
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec
    from train_helpers import token_task  # the recurrent strategy tests' task, one definition

    x, y = token_task(320)

    def acc(strategy: str, options: dict, lr: float) -> float:
        out = []
        for seed in seeds:
            spec = TrainSpec.of(network=network_spec("lstm_classifier", {"vocab_size": 20, "embed": 8, "hidden": 16}),
                                epochs=epochs, batchSize=BATCH, learningRate=lr, strategy=strategy,
                                strategyOptions=options, validationFraction=0.25, tokenBudget=1024, torch_threads=1,
                                seed=seed)
            out.append(run_threads(spec, shard_rows(x, y, 2))[0].history[-1]["accuracy"])
        return float(np.mean(out))

    rows = [("sync (local adam)", "sync", {})]
    rows += [(f"dcasgd {rule}", "dcasgd", {"serverOptimizer": rule}) for rule in RECURRENT_RULES]
    rows += [(f"dcasgd adagrad lambda_={lam:g}", "dcasgd", {"lambda_": lam}) for lam in RECURRENT_LAMBDAS]
    lines = [f"{'run':28s} " + " ".join(f"{'lr ' + format(r, 'g'):>9s}" for r in RECURRENT_RATES)]
    for label, strategy, options in rows:
        accs = [acc(strategy, options, lr) for lr in RECURRENT_RATES]
        lines.append(f"{label:28s} " + " ".join(f"{a:9.3f}" for a in accs))
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 workers, one rate, one seed, 2 epochs: a smoke run")
    parser.add_argument("--recurrent", action="store_true", help="the LSTM over variable-length rows (threads)")
    args = parser.parse_args()
    run = Run(__file__, packages=("torch",))
    if args.recurrent:
        seeds = SEEDS[:2]
        rows = recurrent(seeds)
        text = "\n".join([*run.header(
            "one torch thread per worker; thread backend (requests served in rank order)",
            "lstm_classifier 20-8-16 over token-id rows of 3-40 tokens (is token 7 in the row), 2 workers, batch "
            f"{BATCH}, 6 epochs, validation accuracy (80 rows) after the last epoch, mean over seeds {list(seeds)}; "
            "sync steps the local Adam at the rate, dcasgd's server rule runs at it (lambda_=2, adaptive, unless "
            "the row says otherwise; rmsprop: decay 0.9, epsilon 1)"), "", *rows])
        print(text)
        (RESULTS / "dcasgd_recurrent.txt").write_text(text.rstrip() + "\n")
        return
    data = load_digits_split(False)
    workers, rates, seeds, epochs = ((2,), RATES[:1], SEEDS[:1], 2) if args.quick else (WORKERS, RATES, SEEDS, EPOCHS)
    pool = Pool(max(workers))
    try:
        processes = grid(pool.run, data, workers, rates, seeds, epochs)
    finally:
        pool.close()
    threads: list[str] = []
    for workload, (arch, options, shape, w_epochs) in WORKLOADS.items():
        images = arch == "small_cnn"
        w_data = load_digits_split(images) if images else data
        w_workers, w_rates = ((2,), SWEEP_RATES[1:2]) if args.quick else (SWEEP_WORKERS, SWEEP_RATES)
        threads += ["", f"{workload}: {arch} {options}, {2 if args.quick else w_epochs} epochs, batch {BATCH} per "
                        f"worker, mean test accuracy over seeds {list(seeds)}", ""]
        threads += sweep(workload, w_data, w_workers, w_rates, seeds, 2 if args.quick else w_epochs)
        print("\n".join(threads), flush=True)
    from irbis.train.strategies import DCASGD

    default = DCASGD()
    text = "\n".join([*run.header(
        "one torch thread per worker",
        f"digits MLP 64-128-10, server rule at a constant rate, batch {BATCH} per worker, {epochs} epochs, seeds "
        f"{list(seeds)}; dcasgd's defaults: lambda_={default.lambda_:g}, adaptive={default.adaptive}, "
        f"serverOptimizer={default.serverOptimizer!r}",
        "staleness: mean over the updates; |dc|/|g|: mean over the updates of the compensation's norm over the "
        "gradient's; 'vs downpour sgd': mean over the seeds of each seed's test accuracy minus downpour sgd's "
        "(360 test rows: one row is 0.28 pts)"),
        "", "PROCESSES (gloo + ZeroMQ, shards co-located): staleness of concurrent workers, timing-dependent",
        *processes,
        "THREADS (requests served in rank order, staleness (N - 1) / 2): the same schedule on every run, so a "
        "difference is the rule's. Each strategy on each server rule at every rate of the sweep",
        *threads,
    ])
    print(text)
    if not args.quick:
        (RESULTS / "dcasgd_defaults.txt").write_text(text.rstrip() + "\n")


if __name__ == "__main__":
    sys.exit(main())
