"""End to end on Spark: Irbis's asynchronous strategies against sparktorch hogwild, each at its own swept rate.

Both sides train the digits MLP 64-128-10 on the same ``local[2]`` session, from the same cached
DataFrame, with 2 workers (Spark tasks), global batch 64 (32 rows per worker), the same epochs' worth
of samples and plain SGD on the server: Irbis through ``TorchEstimator(...).fit(df)`` (with its cosine
schedule), sparktorch through ``SparkTorch(mode="hogwild").fit(df)`` (:mod:`peers`; it has no
schedule). samples/s is ``epochs * rows`` over the wall time of ``fit``.

Each side's learning rate comes from its own sweep over a small grid, run with the same epochs on
80% of the training rows and chosen by accuracy on the other 20% (validation; the test rows are not
used): Irbis's strategies at 0.5, 1, 2 and 4 times the rate ``train_async.learning_rate`` gives them,
sparktorch at ``HOGWILD_RATES``. The sweep runs before the measured runs in the same session, so
both sides' Spark Python workers are warm when timed (equal warm-up). A rate chosen at an edge of its grid
is not trusted: the grid grows past that edge (by the grid's own step) until the best rate has a neighbour on
each side, at most ``MAX_WIDEN`` times, and the sweep's line says where it stopped. Each side then makes
``REPEATS`` timed runs at its chosen rate on all the training rows; the faster is reported, with its test
accuracy. dcasgd runs on an SGD server here (``train_async.DCASGD_SGD``; its default rule is Adagrad), as the
row's label says.

Run: ``python benchmarks/async_e2e.py [--quick]``; results in ``benchmarks/results/async_e2e.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from peers import PeerNotRun, digits_frame, not_run, sparktorch_fit
from provenance import Run
from train_async import ASYNC, MLP_EPOCHS, SCHEDULE, learning_rate
from train_sync import MLP, accuracy, load_digits_split, spark_fit

#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 2
RESULTS = Path(__file__).parent / "results"
RATE_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
HOGWILD_RATES = (0.0003, 0.001, 0.003, 0.01, 0.03)
MAX_WIDEN = 3  # grid steps added past an edge at most, per side
CHANCE = 0.1  # ten balanced classes
REPEATS = 2  # timed runs per side at its chosen rate; the faster one is reported, with its accuracy


def split_validation(data: tuple) -> tuple:
    """``data`` with its training rows split 80/20 (stratified) into training and validation rows."""
    from sklearn.model_selection import train_test_split

    xtr, _, ytr, _ = data
    xfit, xval, yfit, yval = train_test_split(xtr, ytr, test_size=0.2, stratify=ytr, random_state=0)
    return xfit, xval, yfit, yval


def irbis_run(df: object, data: tuple, epochs: int, strategy: str, sopts: dict, lr: float,
              schedule: dict, workers: int = 2) -> dict:
    """One ``TorchEstimator.fit`` with plain SGD at ``lr``: samples/s end to end and in the loop, accuracy."""
    row, _ = spark_fit(df, "mlp", MLP, data, [64], epochs, strategy, workers, optimizer="sgd", learningRate=lr,
                       learningRateSchedule=json.dumps(schedule), strategyOptions=json.dumps(sopts))
    return row


def hogwild_run(df: object, data: tuple, epochs: int, lr: float, workers: int = 2) -> dict:
    """One sparktorch hogwild fit with SGD at ``lr`` on its server, from initial weights seeded 0."""
    from irbis.models import build_model

    _, xte, ytr, yte = data
    iters = max(1, epochs * len(ytr) // 64)
    torch.manual_seed(0)
    module, secs = sparktorch_fit(df, build_model("mlp", **MLP), "hogwild", "sgd", lr, iters, workers)
    return {"mode": "sparktorch hogwild", "workers": workers, "e2e": iters * 64 / secs, "loop": float("nan"),
            "wall": secs, "acc": accuracy(module, xte, yte, [64])}


def contenders(strategies: dict, rate: Callable[[str, dict], float], schedule: dict,
               quick: bool) -> dict[str, tuple[tuple[float, ...], Callable]]:
    """Each side's name, rate grid and ``run(df, data, epochs, lr)``."""
    out = {}
    for name, sopts in strategies.items():
        grid = tuple(rate(name, sopts) * f for f in RATE_FACTORS[: 2 if quick else None])
        label = f"irbis {name}" + (f" {sopts}" if sopts else "")
        out[label] = (grid, lambda df, d, e, lr, n=name, o=sopts: irbis_run(df, d, e, n, o, lr, schedule))
    out["sparktorch hogwild"] = (HOGWILD_RATES[: 2 if quick else None], hogwild_run)
    return out


def swept(run: Callable, df: object, data: tuple, epochs: int, lr: float) -> float:
    """Validation accuracy of one sweep run, or NaN where the loss diverged at that rate."""
    from irbis.errors import NonFiniteLossError

    try:
        return run(df, data, epochs, lr)["acc"]
    except NonFiniteLossError:
        return float("nan")


def best_rate(tried: dict[float, float]) -> float:
    """The rate of the best validation accuracy (NaN: the loss diverged); the smallest rate if all diverged."""
    rates = sorted(tried)
    accs = [tried[lr] for lr in rates]
    return rates[int(np.nanargmax(accs))] if not np.isnan(accs).all() else rates[0]


def widened(tried: dict[float, float]) -> float | None:
    """The next rate to try past the grid's edge where the best rate sits on that edge (the grid's own step
    beyond it), or None where the best rate has a neighbour on each side. Past the top, only if the top rate
    did not diverge."""
    rates = sorted(tried)
    best = best_rate(tried)
    if len(rates) < 2 or rates[0] < best < rates[-1]:
        return None
    if best == rates[-1] and not np.isnan(tried[best]):
        return best * rates[-1] / rates[-2]
    if best == rates[0]:
        return best * rates[0] / rates[1]
    return None


def sweep_rates(grid: tuple[float, ...], score: Callable[[float], float]) -> dict[float, float]:
    """``score`` of each rate of ``grid``, then of the rates :func:`widened` adds past an edge where the best
    sits there, at most ``MAX_WIDEN`` times."""
    tried = {lr: score(lr) for lr in grid}
    for _ in range(MAX_WIDEN):
        beyond = widened(tried)
        if beyond is None:
            break
        tried[beyond] = score(beyond)
    return tried


def sweep_and_measure(spark: object, data: tuple, epochs: int, sides: dict) -> tuple[list[str], list[dict]]:
    """The sweep's lines and each side's measured row at its chosen rate (or a "not run" line)."""
    xfit, xval, yfit, yval = split_validation(data)
    fit_df, full_df = digits_frame(spark, xfit, yfit), digits_frame(spark, data[0], data[2])
    lines, chosen = [], {}
    for label, (grid, run) in sides.items():
        try:
            tried = sweep_rates(grid, lambda lr: swept(run, fit_df, (xfit, xval, yfit, yval), epochs, lr))
        except PeerNotRun as err:
            lines.append("  " + not_run(label, err))
            continue
        rates = sorted(tried)
        chosen[label] = best_rate(tried)
        lines.append(f"  {label:34s} " + "  ".join(f"{lr:.4g}: {tried[lr]:.3f}" for lr in rates)
                     + f"  -> {chosen[label]:.4g}"
                     + (" (an edge of its grid)" if chosen[label] in (rates[0], rates[-1]) else ""))
        print(lines[-1], flush=True)
    rows = []
    for label, lr in chosen.items():
        runs = [sides[label][1](full_df, data, epochs, lr) for _ in range(REPEATS)]
        rows.append({**max(runs, key=lambda r: r["e2e"]), "mode": label, "lr": lr})
        print(rows[-1], flush=True)
    fit_df.unpersist()
    full_df.unpersist()
    return lines, rows


def report(epochs: int, sweep_lines: list[str], rows: list[dict]) -> list[str]:
    """The end-to-end table: each row's rate, samples/s, test accuracy and speed against sparktorch hogwild."""
    base = next((r for r in rows if r["mode"] == "sparktorch hogwild"), None)
    out = [f"END TO END ON SPARK (local[2], fit on a DataFrame): digits MLP 64-128-10, 2 workers, global batch 64, "
           f"{epochs} epochs, equal samples",
           "learning rates: each side's own sweep, same epochs on 80% of the training rows, chosen by accuracy on "
           "the other 20% (validation accuracy below); warm-up: both sides (the sweep ran first in this session); "
           f"then {REPEATS} timed runs per side on all training rows, the faster reported with its test accuracy",
           *sweep_lines,
           f"{'mode':34s} {'lr':>7s} {'e2e samples/s':>14s} {'loop samples/s':>15s} {'test acc':>9s}  "
           f"{'vs sparktorch hogwild':>21s}"]
    for r in rows:
        ratio = f"{r['e2e'] / base['e2e']:.1f}x" if base else "-"
        out.append(f"{r['mode']:34s} {r['lr']:7.4f} {r['e2e']:14,.0f} {r['loop']:15,.0f} {r['acc']:9.3f}  {ratio:>21s}")
    if base is None:
        out.append("sparktorch hogwild: not run (see the sweep above): no baseline in this table")
    else:
        learned = "did NOT learn (near chance, 0.1)" if base["acc"] < CHANCE + 0.2 else "learned"
        out.append(f"sparktorch hogwild {learned}: test acc {base['acc']:.3f}; its e2e includes its fixed 5 s "
                   f"start-up sleep (without it: {base['e2e'] * base['wall'] / (base['wall'] - 5):,.0f} samples/s); "
                   "it reports no loop time (nan)")
    return out


def end_to_end(epochs: int, quick: bool) -> list[str]:
    """Irbis's asynchronous strategies (``train_async.ASYNC``) and sparktorch hogwild, both fit on Spark."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from irbis.spark.session import get_spark

    spark = get_spark("local[2]", app_name="irbis-async-bench", **{"spark.ui.enabled": "false",
                                                                    "spark.sql.shuffle.partitions": "2"})
    sides = contenders(ASYNC, lambda name, sopts: learning_rate(name, sopts, 2), SCHEDULE, quick)
    lines, rows = sweep_and_measure(spark, load_digits_split(False), epochs, sides)
    spark.stop()
    return report(epochs, lines, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 epochs, two rates a side: a smoke run")
    args = parser.parse_args()
    run = Run(__file__, packages=("torch", "pyspark", "sparktorch", "numpy"))
    body = end_to_end(2 if args.quick else MLP_EPOCHS, quick=args.quick)
    text = "\n".join([*run.header("cosine schedule for Irbis's strategies; base rates from train_async.py"), "",
                      *body]) + "\n"
    print(text)
    if not args.quick:
        (RESULTS / "async_e2e.txt").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
