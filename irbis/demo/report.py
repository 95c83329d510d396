"""Scores of the demo's variants: metrics, the printed table, ROC and confusion-matrix figures, an HTML page.

Pure numpy / matplotlib (Agg backend, no display needed); the demo collects each variant's test labels
and scores to the driver (a few hundred numbers) and hands them here.
"""
from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["Scores", "format_table", "score", "write_report"]


@dataclass(frozen=True)
class Scores:
    """Test metrics of one variant (the positive class is 1; a score >= 0.5 predicts it)."""

    variant: str
    description: str
    accuracy: float
    roc_auc: float
    precision: float
    recall: float
    images: int
    confusion: tuple[tuple[int, int], tuple[int, int]]  # rows: true 0/1, columns: predicted 0/1


def roc_auc(y: np.ndarray, s: np.ndarray) -> float:
    """Area under the ROC curve (the probability that a positive outscores a negative; ties count half)."""
    pos, neg = s[y == 1], s[y == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def score(variant: str, description: str, y: np.ndarray, s: np.ndarray) -> Scores:
    """Metrics of scores ``s`` (probability of class 1) against labels ``y`` (0/1)."""
    y, s = np.asarray(y, np.float64), np.asarray(s, np.float64)
    p = s >= 0.5
    tp, fp = int(np.sum(p & (y == 1))), int(np.sum(p & (y == 0)))
    fn, tn = int(np.sum(~p & (y == 1))), int(np.sum(~p & (y == 0)))
    return Scores(variant, description, accuracy=float(np.mean(p == (y == 1))), roc_auc=roc_auc(y, s),
                  precision=tp / (tp + fp) if tp + fp else 0.0, recall=tp / (tp + fn) if tp + fn else 0.0,
                  images=len(y), confusion=((tn, fp), (fn, tp)))


def format_table(rows: list[Scores]) -> str:
    """The printed table: one line per variant."""
    lines = [f"{'variant':10s} {'accuracy':>8s} {'ROC AUC':>8s} {'precision':>9s} {'recall':>7s}  description",
             "-" * 96]
    for r in rows:
        lines.append(f"{r.variant:10s} {r.accuracy:8.3f} {r.roc_auc:8.3f} {r.precision:9.3f} {r.recall:7.3f}  "
                     f"{r.description}")
    return "\n".join(lines)


def _roc_points(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-s, kind="stable")
    y, s = y[order], s[order]
    last = np.r_[np.diff(s) != 0, True]  # one point per distinct threshold
    tps, fps = np.cumsum(y)[last], np.cumsum(1 - y)[last]
    return np.r_[0.0, fps / max(fps[-1], 1)], np.r_[0.0, tps / max(tps[-1], 1)]


def _figures(folder: Path, rows: list[Scores], curves: dict[str, tuple[np.ndarray, np.ndarray]],
             class_names: tuple[str, str]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = {}
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for r in rows:
        fpr, tpr = _roc_points(*curves[r.variant])
        ax.plot(fpr, tpr, label=f"{r.variant} (AUC {r.roc_auc:.3f})")
    ax.plot([0, 1], [0, 1], ls=":", c="grey")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC on the test cameras")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(folder / "roc.png", dpi=100)
    plt.close(fig)
    files["roc"] = "roc.png"
    for r in rows:
        cm = np.asarray(r.confusion, np.float64)
        norm = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
        fig, ax = plt.subplots(figsize=(3.2, 3))
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
        plt.close(fig)
        files[r.variant] = name
    return files


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def write_report(folder: str | Path, rows: list[Scores], curves: dict[str, tuple[np.ndarray, np.ndarray]],
                 class_names: tuple[str, str], notes: dict[str, str]) -> Path:
    """Write ``report.html``, ``roc.png``, ``confusion_<variant>.png`` and ``metrics.json`` into ``folder``.

    ``curves`` maps each variant to its test ``(labels, scores)``; ``class_names`` are the names of
    classes 0 and 1; ``notes`` are shown as a definition list (data, split, timings).
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    files = _figures(out, rows, {k: (np.asarray(y, float), np.asarray(s, float)) for k, (y, s) in curves.items()},
                     class_names)
    (out / "metrics.json").write_text(json.dumps({"variants": [asdict(r) for r in rows], "notes": notes}, indent=2))
    esc = html.escape
    table = "".join(f"<tr><td>{esc(r.variant)}</td><td>{r.accuracy:.3f}</td><td>{r.roc_auc:.3f}</td>"
                    f"<td>{r.precision:.3f}</td><td>{r.recall:.3f}</td><td>{esc(r.description)}</td></tr>"
                    for r in rows)
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in notes.items())
    mats = "".join(f'<figure><img src="{files[r.variant]}" alt="confusion matrix of {esc(r.variant)}"></figure>'
                   for r in rows)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Irbis camera-trap demo</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}td,th{{padding:4px 10px;text-align:right}}
td:last-child{{text-align:left}}figure{{display:inline-block;margin:4px}}dt{{font-weight:bold}}</style></head><body>
<h1>Camera-trap classifier: the Snow Leopard ladder</h1>
<table><tr><th>variant</th><th>accuracy</th><th>ROC AUC</th><th>precision</th><th>recall</th><th>what</th></tr>
{table}</table>
<h2>ROC curves</h2><img src="{files['roc']}" alt="ROC curves">
<h2>Normalised confusion matrices</h2>{mats}
<h2>Run</h2><dl>{facts}</dl></body></html>"""
    (out / "report.html").write_text(page)
    return out / "report.html"
