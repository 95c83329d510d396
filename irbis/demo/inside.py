"""A look inside the demo's ladder: the ladder chart, the gallery of mistakes and LIME overlays.

The two figures are matplotlib (Agg backend) over the driver's few hundred test scores; the LIME
overlays run :class:`irbis.ml.ImageLIME` on Spark over the saved pipeline, as ``irbis explain`` does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from irbis.explain.plot import figure
from irbis.extras import optional

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

__all__ = ["explain_images", "gallery_of_mistakes", "ladder_chart"]


def ladder_chart(path: Path, rows: list[Any], paper: dict[str, float],
                 ylabel: str = "on the test cameras (95% CI)") -> None:
    """Bars of accuracy and ROC AUC per variant with their 95 % intervals; the paper's accuracy as marks."""
    x = np.arange(len(rows))
    fig, ax = figure(max(6.0, 1.3 * len(rows)), 4.2)
    for offset, metric, colour in ((-0.2, "accuracy", "#4C72B0"), (0.2, "roc_auc", "#55A868")):
        values = np.array([getattr(r, metric) for r in rows])
        cis = np.array([getattr(r, f"{metric}_ci") for r in rows])
        err = np.abs(np.vstack([values - cis[:, 0], cis[:, 1] - values]))
        ax.bar(x + offset, values, 0.38, yerr=err, capsize=3, color=colour,
               label="accuracy" if metric == "accuracy" else "ROC AUC")
    marks = [(i, paper[r.variant]) for i, r in enumerate(rows) if r.variant in paper]
    if marks:
        ax.scatter([i - 0.2 for i, _ in marks], [v for _, v in marks], marker="D", color="black", zorder=3,
                   label="paper's accuracy (ResNet-50 rungs)")
    ax.axhline(0.5, ls=":", c="grey")
    ax.set(xticks=x, ylim=(0.3, 1.02), ylabel=ylabel, title="The ladder")
    ax.set_xticklabels([r.variant for r in rows], rotation=15)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def gallery_of_mistakes(path: Path, scored: pd.DataFrame, variant: str, limit: int = 12) -> int:
    """Draw up to ``limit`` misclassified test images, the most confidently wrong first; return how many
    are wrong in all."""
    wrong = scored[(scored["score"] >= 0.5) != (scored["y"] == 1)].copy()
    wrong["confidence"] = (wrong["score"] - 0.5).abs()
    shown = wrong.sort_values("confidence", ascending=False).head(limit)
    cols = 4
    rows = max(1, -(-len(shown) // cols))
    fig, axes = figure(3 * cols, 2.5 * rows, rows, cols, squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, item in zip(axes.ravel(), shown.itertuples()):
        bgr = cv2.imread(item.path)
        if bgr is not None:
            ax.imshow(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
        truth = "positive" if item.y == 1 else "negative"
        ax.set_title(f"{item.camera}/{Path(item.path).parent.name}\n{truth}, score {item.score:.2f}", fontsize=8)
    if shown.empty:
        axes[0, 0].text(0.5, 0.5, f"{variant}: no mistakes on the test cameras", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return len(wrong)


def explain_images(spark: Any, out: Path, paths: list[str], samples: int = 120) -> Path:
    """LIME overlays of ``paths`` for the pipeline saved in ``out/model``, written to ``out/lime``."""
    from pyspark.ml import PipelineModel

    from irbis.explain.page import ExplainedImage, write_explanation_page
    from irbis.kernels.image.decode import struct_to_array
    from irbis.ml.lime import ImageLIME
    from irbis.spark.images import read_images

    model = PipelineModel.load(str(out / "model"))
    last = model.stages[-1]  # the MLP head (TorchModel) writes logits, a logistic regression probabilities
    target = "logits" if last.hasParam("outputCol") and last.getOrDefault("outputCol") == "logits" else "probability"
    images = read_images(paths, recursive=False, spark=spark)
    lime = ImageLIME(model=model, inputCol="image", targetCol=target, targetClasses=[1], numSamples=samples,
                     cellSize=32.0)
    items = []
    for row in lime.transform(images).orderBy("path").toLocalIterator():
        ok = row.weights is not None
        items.append(ExplainedImage(
            "/".join(row.path.split("/")[-3:]), struct_to_array(row.image) if ok else None,
            np.array(row.superpixels) if ok else None, np.array(row.weights[0]) if ok else None,
            row.r2[0] if ok else None, row.explainError or row.error))
    return write_explanation_page(out / "lime", items, top=5, title="What the saved pipeline looked at")
