"""Scores of the demo's variants: metrics, the printed table, ROC and confusion-matrix figures, an HTML page.

Pure numpy / matplotlib (Agg backend, no display needed); the demo collects each variant's test labels
and scores to the driver (a few hundred numbers) and hands them here.
"""
from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from irbis.demo.stats import accuracy, bootstrap_ci, roc_auc

__all__ = ["Scores", "Step", "format_table", "score", "score_variants", "write_report"]


@dataclass(frozen=True)
class Scores:
    """Test metrics of one variant (the positive class is 1; a score >= 0.5 predicts it), with 95 %
    bootstrap intervals ``(low, high)`` over the test bursts."""

    variant: str
    description: str
    accuracy: float
    roc_auc: float
    precision: float
    recall: float
    images: int
    confusion: tuple[tuple[int, int], tuple[int, int]]  # rows: true 0/1, columns: predicted 0/1
    accuracy_ci: tuple[float, float] = (float("nan"), float("nan"))
    roc_auc_ci: tuple[float, float] = (float("nan"), float("nan"))


@dataclass(frozen=True)
class Step:
    """One rung against the one it builds on: differences with paired 95 % intervals."""

    variant: str
    base: str
    accuracy: tuple[float, float, float]  # difference, low, high
    roc_auc: tuple[float, float, float]

    def verdict(self, metric: str) -> str:
        diff, low, high = getattr(self, metric)
        return "better" if low > 0 else "worse" if high < 0 else "not significant"


def score(variant: str, description: str, y: np.ndarray, s: np.ndarray, groups: np.ndarray | None = None,
          n_boot: int = 1000, seed: int = 0) -> Scores:
    """Metrics of scores ``s`` (probability of class 1) against labels ``y`` (0/1); intervals over
    ``groups`` (the burst of each image) when given."""
    y, s = np.asarray(y, np.float64), np.asarray(s, np.float64)
    p = s >= 0.5
    tp, fp = int(np.sum(p & (y == 1))), int(np.sum(p & (y == 0)))
    fn, tn = int(np.sum(~p & (y == 1))), int(np.sum(~p & (y == 0)))
    cis = {}
    if groups is not None:
        cis = {f"{m.__name__}_ci": bootstrap_ci(m, y, s, groups, n_boot=n_boot, seed=seed)[1:]
               for m in (accuracy, roc_auc)}
    return Scores(variant, description, accuracy=accuracy(y, s), roc_auc=roc_auc(y, s),
                  precision=tp / (tp + fp) if tp + fp else 0.0, recall=tp / (tp + fn) if tp + fn else 0.0,
                  images=len(y), confusion=((tn, fp), (fn, tp)), **cis)


def score_variants(scored: dict[str, Any], descriptions: dict[str, str], builds_on: dict[str, str],
                   n_boot: int = 1000, seed: int = 0, key: str = "path",
                   groups: tuple[str, ...] = ("camera", "burst")) -> tuple[list[Scores], list[Step]]:
    """Scores of every variant and the steps of ``builds_on`` (variant -> base), all on the same
    resampled groups. ``scored`` maps each variant to a frame with columns ``key``, ``groups``, y, score
    of the same test rows (by default images: path, camera, burst; the unit of resampling is the burst)."""
    first = next(iter(scored.values()))
    for name, frame in scored.items():
        if list(frame[key]) != list(first[key]):
            raise ValueError(f"variant {name} was scored on other test rows than {next(iter(scored))}")
    units = first[list(groups)].astype(str).agg("/".join, axis=1).to_numpy()
    y = first["y"].to_numpy(np.float64)
    rows = [score(n, descriptions.get(n, ""), y, f["score"].to_numpy(), units, n_boot, seed)
            for n, f in scored.items()]
    steps = []
    for name, base in builds_on.items():
        if name in scored and base in scored:
            s, b = scored[name]["score"].to_numpy(), scored[base]["score"].to_numpy()
            steps.append(Step(name, base, *(bootstrap_ci(m, y, s, units, n_boot=n_boot, seed=seed, baseline=b)
                                           for m in (accuracy, roc_auc))))
    return rows, steps


def _ci(value: float, ci: tuple[float, float]) -> str:
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def format_table(rows: list[Scores], steps: Sequence[Step] = ()) -> str:
    """The printed table: one line per variant with 95 % intervals, then each step's differences."""
    lines = [f"{'variant':14s} {'accuracy [95% CI]':>22s} {'ROC AUC [95% CI]':>22s}  description", "-" * 110]
    for r in rows:
        lines.append(f"{r.variant:14s} {_ci(r.accuracy, r.accuracy_ci):>22s} {_ci(r.roc_auc, r.roc_auc_ci):>22s}"
                     f"  {r.description}")
    if steps:
        lines += ["", f"{'step':26s} {'accuracy difference':>34s} {'ROC AUC difference':>34s}", "-" * 96]
        for st in steps:
            cells = [f"{getattr(st, m)[0]:+.3f} [{getattr(st, m)[1]:+.3f}, "
                     f"{getattr(st, m)[2]:+.3f}] {_mark(st.verdict(m))}" for m in ("accuracy", "roc_auc")]
            lines.append(f"{st.base + ' -> ' + st.variant:26s} {cells[0]:>34s} {cells[1]:>34s}")
        lines.append("(+ / -: the 95% interval of the difference excludes 0; ~: it includes 0, not significant)")
    return "\n".join(lines)


def _mark(verdict: str) -> str:
    return {"better": "+", "worse": "-"}.get(verdict, "~")


def _roc_points(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-s, kind="stable")
    y, s = y[order], s[order]
    last = np.r_[np.diff(s) != 0, True]  # one point per distinct threshold
    tps, fps = np.cumsum(y)[last], np.cumsum(1 - y)[last]
    return np.r_[0.0, fps / max(fps[-1], 1)], np.r_[0.0, tps / max(tps[-1], 1)]


def _figures(folder: Path, rows: list[Scores], curves: dict[str, tuple[np.ndarray, np.ndarray]],
             class_names: tuple[str, str]) -> dict[str, str]:
    from irbis.explain.plot import figure

    files = {}
    fig, ax = figure(5.5, 5)
    for r in rows:
        fpr, tpr = _roc_points(*curves[r.variant])
        ax.plot(fpr, tpr, label=f"{r.variant} (AUC {r.roc_auc:.3f})")
    ax.plot([0, 1], [0, 1], ls=":", c="grey")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC on the test cameras")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(folder / "roc.png", dpi=100)
    files["roc"] = "roc.png"
    for r in rows:
        cm = np.asarray(r.confusion, np.float64)
        norm = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
        fig, ax = figure(3.2, 3)
        ax.imshow(norm, vmin=0, vmax=1, cmap="Blues")
        for i in range(2):
            for j in range(2):
                ax.text(j, i, f"{norm[i, j]:.2f}", ha="center", va="center",
                        color="white" if norm[i, j] > 0.5 else "black")
        ax.set(xticks=[0, 1], yticks=[0, 1], xticklabels=class_names, yticklabels=class_names,
               xlabel="predicted", ylabel="true", title=r.variant)
        fig.tight_layout()
        name = f"confusion_{_slug(r.variant)}.png"
        fig.savefig(folder / name, dpi=100)
        files[r.variant] = name
    return files


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _html_row(r: Scores, paper: float | None) -> str:
    cells = [html.escape(r.variant), _ci(r.accuracy, r.accuracy_ci), _ci(r.roc_auc, r.roc_auc_ci),
             f"{r.precision:.3f}", f"{r.recall:.3f}", "" if paper is None else f"{paper:.1%}"]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _json_scalar(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (``json.dumps``'s ``default``)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_report(folder: str | Path, rows: list[Scores], steps: list[Step], scored: dict[str, Any],
                 class_names: tuple[str, str], notes: dict[str, str], paper: dict[str, float],
                 extra: dict[str, Any] | None = None) -> Path:
    """Write ``report.html``, ``roc.png``, ``ladder.png``, ``wrong.png``, ``confusion_<variant>.png`` and
    ``metrics.json`` into ``folder``.

    ``scored`` maps each variant to its test frame (path, camera, burst, y, score); ``class_names`` are
    the names of classes 0 and 1; ``notes`` are shown as a definition list (data, split, timings);
    ``paper`` holds the paper's accuracy of the rungs it reports, drawn beside ours; ``extra`` is kept in
    ``metrics.json`` beside them (JSON; numpy scalars as numbers).
    """
    from irbis.demo.inside import gallery_of_mistakes, ladder_chart

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    curves = {k: (f["y"].to_numpy(float), f["score"].to_numpy(float)) for k, f in scored.items()}
    files = _figures(out, rows, curves, class_names)
    ladder_chart(out / "ladder.png", rows, paper)
    best = max(rows, key=lambda r: (r.roc_auc, r.accuracy)).variant
    wrong = gallery_of_mistakes(out / "wrong.png", scored[best], best)
    (out / "metrics.json").write_text(json.dumps({"variants": [asdict(r) for r in rows],
                                                  "steps": [{**asdict(st), "accuracy_verdict": st.verdict("accuracy"),
                                                             "roc_auc_verdict": st.verdict("roc_auc")} for st in steps],
                                                  "paper_accuracy": paper, "notes": notes, **(extra or {})},
                                                 indent=2, default=_json_scalar))
    esc = html.escape
    table = "".join(_html_row(r, paper.get(r.variant)) for r in rows)
    step_rows = "".join(f"<tr><td>{esc(st.base)} &rarr; {esc(st.variant)}</td>"
                        + "".join(f"<td>{getattr(st, m)[0]:+.3f} [{getattr(st, m)[1]:+.3f}, {getattr(st, m)[2]:+.3f}]"
                                  f"</td><td>{st.verdict(m)}</td>" for m in ("accuracy", "roc_auc")) + "</tr>"
                        for st in steps)
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in notes.items())
    mats = "".join(f'<figure><img src="{files[r.variant]}" alt="confusion matrix of {esc(r.variant)}"></figure>'
                   for r in rows)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Irbis camera-trap demo</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}td,th{{padding:4px 10px;text-align:right}}
td:first-child{{text-align:left}}figure{{display:inline-block;margin:4px}}dt{{font-weight:bold}}</style></head><body>
<h1>Camera-trap classifier: the Snow Leopard ladder</h1>
<p>Every figure is measured on cameras held out of training, with a 95% bootstrap interval over the test
bursts. A step is significant when the paired interval of its difference excludes 0.</p>
<table><tr><th>variant</th><th>accuracy [95% CI]</th><th>ROC AUC [95% CI]</th><th>precision</th><th>recall</th>
<th>paper's accuracy</th></tr>{table}</table>
<h2>The ladder</h2><img src="ladder.png" alt="accuracy and ROC AUC of each variant with 95% intervals">
<h2>Each step against the one it builds on</h2>
<table><tr><th>step</th><th>accuracy difference</th><th></th><th>ROC AUC difference</th><th></th></tr>
{step_rows}</table>
<h2>What the best variant ({esc(best)}) gets wrong</h2>
<p>{wrong} misclassified test images (up to 12 shown, most confident first).</p>
<img src="wrong.png" alt="misclassified test images">
<h2>What the model looked at (LIME)</h2>
<p><a href="lime/index.html">LIME overlays</a> of a few test images, for the saved pipeline.</p>
<h2>ROC curves</h2><img src="{files['roc']}" alt="ROC curves">
<h2>Normalised confusion matrices</h2>{mats}
<h2>Run</h2><dl>{facts}</dl>
<p>Variants: {"; ".join(f"<b>{esc(r.variant)}</b>: {esc(r.description)}" for r in rows)}</p></body></html>"""
    (out / "report.html").write_text(page)
    return out / "report.html"
