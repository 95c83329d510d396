"""``irbis demo --text``: the text ladder on the drug reviews, with intervals, as the camera-trap demo climbs.

The package's own split holds 600 training and 379 test reviews (:mod:`irbis.demo.reviews`). Every rung of
:mod:`irbis.demo.text_ladder` has its settings chosen by cross-validation on the training reviews grouped by
drug, is refitted on all of them, and is scored once on the test reviews. Each rung's test accuracy and ROC
AUC carry a 95 % bootstrap interval over the test reviews (each review is one patient's: the unit of
resampling), and each step's difference against the rung below it a paired interval on the same
resamples (:mod:`irbis.demo.stats`), whichever rung wins.

Examples
--------
>>> result = run_text_demo(spark, "text-demo")                 # doctest: +SKIP
>>> print(result.table)                                        # doctest: +SKIP
"""
from __future__ import annotations

import html
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from irbis.demo.job_progress import spark_progress, timed
from irbis.demo.ladder import camera_folds
from irbis.demo.report import Scores, Step, format_table, score_variants
from irbis.demo.reviews import drug_reviews
from irbis.demo.text_ladder import RUNGS, climb, majority_scores
from irbis.spark.resources import default_parallelism

__all__ = ["MAJORITY", "TextDemoResult", "check_options", "run_text_demo"]

#: The floor's name in the table.
MAJORITY = "majority"
#: The fewest reviews of each split a sampled run takes.
MIN_SAMPLE = 20


@dataclass
class TextDemoResult:
    """What :func:`run_text_demo` produced: the rows of the table (the majority class first), the steps,
    what grouped CV chose, and each review's fold (-1: test)."""

    scores: list[Scores]
    steps: list[Step]
    table: str
    output: Path
    chosen: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    folds: pd.DataFrame | None = None


def check_options(names: list[str] | None, sample: int | None = None, folds: int = 3) -> list[str]:
    """The rungs to climb, in the ladder's order (all of :data:`RUNGS` by default); an unknown name, fewer
    than 2 ``folds``, or a ``sample`` too small for drug-grouped folds and a bootstrap, is refused with what
    would do."""
    if folds < 2:
        raise ValueError(f"folds must be at least 2 (grouped cross-validation), found {folds}")
    if sample is not None and sample < MIN_SAMPLE:
        raise ValueError(f"sample must be at least {MIN_SAMPLE} reviews of each split, found {sample}")
    if names is None:
        return list(RUNGS)
    unknown = [n for n in names if n not in RUNGS]
    if unknown or not names:
        raise ValueError(f"unknown rung(s) {unknown}; the rungs are {', '.join(RUNGS)}")
    return [n for n in RUNGS if n in names]


def reviews_table(folds: int, seed: int, sample: int | None = None) -> pd.DataFrame:
    """The reviews with ``id``, ``y`` (1: positive), ``is_test`` and ``fold``: the training reviews' drugs
    dealt into ``folds`` groups, -1 for the test reviews; ``sample`` reviews of each split when given."""
    data = drug_reviews()
    if sample is not None:
        data = pd.concat([part.sample(n=min(sample, len(part)), random_state=seed)
                          for _, part in data.groupby("split", sort=False)])
    data = data.reset_index(drop=True)
    data["id"] = np.arange(len(data), dtype=np.int64)
    data["y"] = (data["sentiment"] == "positive").astype(np.float64)
    data["is_test"] = data["split"] == "test"
    data["fold"] = camera_folds(data["drug"].fillna("").to_numpy(), data["is_test"].to_numpy(), folds, seed,
                                unit="drugs")
    return data


def run_text_demo(spark: SparkSession, output: str | Path, *, rungs: list[str] | None = None, folds: int = 3,
                  seed: int = 0, n_boot: int = 1000, sample: int | None = None,
                  progress: bool = True) -> TextDemoResult:
    """Climb the text ladder; write ``report.html``, ``ladder.png``, ``metrics.json`` and ``table.txt``.

    Parameters
    ----------
    spark : SparkSession
        The session to run on.
    output : str or Path
        Folder for the report.
    rungs : list of str, optional
        Names of :data:`irbis.demo.text_ladder.RUNGS` to climb (default: all).
    folds, seed : int
        Drug-grouped CV folds on the training reviews; the seed of the folds, the fits and the bootstrap.
    n_boot : int
        Bootstrap resamples of the test reviews per interval.
    sample : int, optional
        Use a random sample of this many reviews of each split (a quick run).
    progress : bool
        Show progress bars.
    """
    names = check_options(rungs, sample, folds)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    clock: dict[str, float] = {}
    start = time.perf_counter()
    data = reviews_table(folds, seed, sample)
    climbing = [RUNGS[n] for n in names]
    texts = spark.createDataFrame(data[["id", "review", "y", "fold", "is_test"]])
    texts = texts.repartition(max(2 * default_parallelism(spark), 4)).cache()
    texts.count()  # in equal cached parts first: the bar below then follows the network's job alone
    rows, n = texts, len(data)
    try:
        with timed(clock, "embed and tokenize"), spark_progress(spark, "embed and tokenize the reviews", n, progress,
                                                                unit="review"):
            for stage in [s for r in climbing for s in r.stages()]:
                rows = stage.transform(rows)
            rows = rows.cache()
            rows.count()
        # one partition: a fit of a few hundred rows waits on its jobs' tasks more than it computes
        train, test = rows.where(~F.col("is_test")).coalesce(1), rows.where(F.col("is_test"))
        scored = {MAJORITY: majority_scores(data.loc[~data["is_test"], "y"].to_numpy(),
                                            data[data["is_test"]])}
        chosen = {}
        for rung in climbing:
            fits = folds * len(rung.grid) if len(rung.grid) > 1 else 0
            with timed(clock, rung.name), spark_progress(spark, f"cross-validate and fit {rung.name}", n, progress,
                                                          steps=fits + 1, unit="review") as bar:
                scored[rung.name], chosen[rung.name] = climb(rung, train, test, folds, seed, on_fit=bar.step)
    finally:
        rows.unpersist()
        texts.unpersist()
    return _finish(out, data, scored, chosen, (n_boot, seed, folds), clock, start)


def _finish(out: Path, data: pd.DataFrame, scored: dict[str, pd.DataFrame], chosen: dict[str, Any],
            opts: tuple[int, int, int], clock: dict[str, float],
            start: float) -> TextDemoResult:
    n_boot, seed, folds = opts
    names = list(scored)
    builds_on = dict(zip(names[1:], names[:-1]))  # each rung against the one below it
    descriptions = {MAJORITY: "the training reviews' majority class for every review",
                    **{n: RUNGS[n].description for n in names[1:]}}
    rows, steps = score_variants(scored, descriptions, builds_on, n_boot=n_boot, seed=seed, key="id",
                                 groups=("id",))
    table = format_table(rows, steps)
    clock["total"] = time.perf_counter() - start
    notes = _notes(data, chosen, n_boot, folds, clock)
    write_text_report(out, rows, steps, notes)
    (out / "table.txt").write_text(table + "\n")
    return TextDemoResult(rows, steps, table, out, chosen, clock,
                          data[["id", "drug", "is_test", "fold"]])


def _notes(data: pd.DataFrame, chosen: dict[str, Any], n_boot: int, folds: int,
           clock: dict[str, float]) -> dict[str, str]:
    train, test = data[~data["is_test"]], data[data["is_test"]]
    return {
        "reviews": f"{len(train)} training and {len(test)} test reviews (the package's split); "
                   f"{train['y'].mean():.3f} and {test['y'].mean():.3f} of them positive",
        "task": "sentiment: positive (rating 7-10) against neutral and negative (rating 1-6), fixed before any fit",
        "cross-validation": f"{folds} folds of the training reviews grouped by drug ({train['drug'].nunique()} "
                            "drugs; a drug's reviews share a fold); the test reviews never enter a choice",
        "chosen by grouped CV (out-of-fold accuracy of each setting)": "; ".join(
            f"{k}: {v}" for k, v in chosen.items()),
        "intervals": f"95% percentile bootstrap over the test reviews ({n_boot} resamples); each step's "
                     "difference is paired (the same resamples)",
        "seconds": ", ".join(f"{k} {v:.1f}" for k, v in clock.items()),
    }


def write_text_report(folder: Path, rows: list[Scores], steps: list[Step], notes: dict[str, str]) -> Path:
    """``report.html``, ``ladder.png`` (each rung with its intervals) and ``metrics.json`` in ``folder``."""
    from irbis.demo.inside import ladder_chart

    ladder_chart(folder / "ladder.png", rows, {}, ylabel="on the test reviews (95% CI)")
    (folder / "metrics.json").write_text(json.dumps({
        "variants": [asdict(r) for r in rows], "notes": notes,
        "steps": [{**asdict(st), "accuracy_verdict": st.verdict("accuracy"), "roc_auc_verdict": st.verdict("roc_auc")}
                  for st in steps]}, indent=2))
    esc = html.escape

    def interval(value: float, ci: tuple[float, float]) -> str:
        return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"

    table = "".join(f"<tr><td>{esc(r.variant)}</td><td>{interval(r.accuracy, r.accuracy_ci)}</td>"
                    f"<td>{interval(r.roc_auc, r.roc_auc_ci)}</td><td>{esc(r.description)}</td></tr>" for r in rows)
    step_rows = "".join(f"<tr><td>{esc(st.base)} &rarr; {esc(st.variant)}</td>"
                        + "".join(f"<td>{getattr(st, m)[0]:+.3f} [{getattr(st, m)[1]:+.3f}, {getattr(st, m)[2]:+.3f}]"
                                  f"</td><td>{st.verdict(m)}</td>" for m in ("accuracy", "roc_auc")) + "</tr>"
                        for st in steps)
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in notes.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Irbis text demo</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}td,th{{padding:4px 10px;text-align:right}}
td:first-child,td:last-child{{text-align:left}}dt{{font-weight:bold}}</style></head><body>
<h1>The text ladder: sentiment of the drug reviews</h1>
<p>Every figure is measured on the test reviews, with a 95% bootstrap interval over them. A step is
significant when the paired interval of its difference excludes 0.</p>
<table><tr><th>rung</th><th>accuracy [95% CI]</th><th>ROC AUC [95% CI]</th><th>what it is</th></tr>{table}</table>
<h2>The ladder</h2><img src="ladder.png" alt="accuracy and ROC AUC of each rung with 95% intervals">
<h2>Each step against the rung below it</h2>
<table><tr><th>step</th><th>accuracy difference</th><th></th><th>ROC AUC difference</th><th></th></tr>
{step_rows}</table>
<h2>Run</h2><dl>{facts}</dl></body></html>"""
    (folder / "report.html").write_text(page)
    return folder / "report.html"
