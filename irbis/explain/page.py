"""An HTML page of image explanations: one overlay PNG per image and a page that shows them all."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from irbis.explain.plot import plot_image_explanation

__all__ = ["ExplainedImage", "write_explanation_page"]


@dataclass
class ExplainedImage:
    """One explained image: its name, BGR pixels, superpixel labels and weights (one target class)."""

    name: str
    image: np.ndarray | None
    segments: np.ndarray | None
    weights: np.ndarray | None
    r2: float | None = None
    error: str | None = None


def _file_name(name: str, used: set[str]) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).stem) or "image"
    candidate, n = f"{stem}.png", 1
    while candidate in used:
        n += 1
        candidate = f"{stem}_{n}.png"
    used.add(candidate)
    return candidate


def write_explanation_page(folder: str | Path, items: list[ExplainedImage], *, top: int = 5,
                           title: str = "What the model looked at") -> Path:
    """Write ``<name>.png`` overlays (the ``top`` superpixels) and ``index.html`` into ``folder``.

    Images without an explanation are listed on the page with their reason. Returns the page's path.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    used: set[str] = {"index.html"}
    cards = []
    for item in items:
        caption = html.escape(item.name)
        if item.weights is None or item.image is None or item.segments is None:
            cards.append(f"<figure><figcaption>{caption}<br><em>no explanation: "
                         f"{html.escape(item.error or 'unknown reason')}</em></figcaption></figure>")
            continue
        png = _file_name(item.name, used)
        plot_image_explanation(item.image, item.segments, item.weights, top=top, path=folder / png)
        fit = "" if item.r2 is None else f" (local fit R² {item.r2:.2f})"
        cards.append(f'<figure><img src="{png}" alt="{caption}"><figcaption>{caption}{fit}</figcaption></figure>')
    page = folder / "index.html"
    page.write_text(
        "<!doctype html><meta charset='utf-8'><title>{t}</title>"
        "<style>body{{font-family:sans-serif}} figure{{display:inline-block;width:300px;margin:8px;"
        "vertical-align:top}} img{{width:100%}}</style><h1>{t}</h1>"
        "<p>The {top} superpixels with the largest positive LIME weights are shown; the rest is dimmed.</p>"
        "{cards}".format(t=html.escape(title), top=top, cards="\n".join(cards)), encoding="utf-8")
    return page
