"""HTML pages of explanations: of images (one overlay PNG per image) and of texts (one bar chart PNG of the
words per text, the words highlighted in place), each with a page that shows them all."""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from irbis.explain.explanations import text_words
from irbis.explain.plot import plot_feature_weights, plot_image_explanation

__all__ = ["ExplainedImage", "ExplainedText", "write_explanation_page", "write_text_explanation_page"]


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


@dataclass
class ExplainedText:
    """One explained text: its name, the text and one weight per word
    (:func:`irbis.explain.explanations.text_words`)."""

    name: str
    text: str | None
    weights: np.ndarray | None
    r2: float | None = None
    error: str | None = None


def _highlighted(text: str, weights: np.ndarray) -> str:
    """``text`` as HTML, each word on a green (positive weight) or red (negative) background as strong as its
    weight against the largest, its weight in its tooltip."""
    scale = float(np.abs(weights).max()) or 1.0
    parts, last = [], 0
    for (start, stop), w in zip(text_words(text), weights):
        colour = "42,170,119" if w > 0 else "204,68,68"
        parts.append(html.escape(text[last:start]))
        parts.append(f'<span title="{w:+.4f}" style="background:rgba({colour},{abs(w) / scale:.2f})">'
                     f"{html.escape(text[start:stop])}</span>")
        last = stop
    parts.append(html.escape(text[last:]))
    return "".join(parts)


def write_text_explanation_page(folder: str | Path, items: list[ExplainedText], *, top: int = 10,
                                title: str = "Which words decided") -> Path:
    """Write ``<name>.png`` bar charts (the ``top`` words by absolute weight), ``explanations.json`` (each text's
    words, weights, fit and reason) and ``index.html`` (the texts, words highlighted by weight) into ``folder``.

    Texts without an explanation are listed on the page with their reason. Returns the page's path.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    used: set[str] = {"index.html"}
    cards, records = [], []
    for item in items:
        caption = html.escape(item.name)
        words = None if item.text is None else [item.text[a:b] for a, b in text_words(item.text)]
        records.append({"name": item.name, "text": item.text, "r2": item.r2, "error": item.error,
                        "words": words if item.weights is not None else None,
                        "weights": None if item.weights is None else [float(w) for w in item.weights]})
        if item.weights is None or item.text is None:
            cards.append(f"<figure><figcaption>{caption}<br><em>no explanation: "
                         f"{html.escape(item.error or 'unknown reason')}</em></figcaption></figure>")
            continue
        png = _file_name(item.name, used)
        plot_feature_weights(item.weights, words, top=top, title=item.name, path=folder / png)
        fit = "" if item.r2 is None else f" (local fit R² {item.r2:.2f})"
        cards.append(f'<figure><p>{_highlighted(item.text, np.asarray(item.weights))}</p>'
                     f'<img src="{png}" alt="{caption}"><figcaption>{caption}{fit}</figcaption></figure>')
    (folder / "explanations.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    page = folder / "index.html"
    page.write_text(
        "<!doctype html><meta charset='utf-8'><title>{t}</title>"
        "<style>body{{font-family:sans-serif}} figure{{display:inline-block;width:420px;margin:8px;"
        "vertical-align:top}} img{{width:100%}}</style><h1>{t}</h1>"
        "<p>Words that raise the explained output are green, words that lower it red; the chart shows the {top} "
        "largest weights.</p>{cards}".format(t=html.escape(title), top=top, cards="\n".join(cards)),
        encoding="utf-8")
    return page
