"""Calibration samples for static int8 quantisation: a folder of the user's, or shipped photographs.

Static quantisation fixes the range of every activation from a sample of real inputs. The sample is
``calibrationData``, a folder of images (preprocessed as the repository model prescribes) or of
``.npy`` arrays of already preprocessed rows, shape (N, *inputShape) or (*inputShape) (a stage given a
DataFrame writes such a folder: :func:`write_rows`); left empty,
a repository model is calibrated on random crops of photographs shipped with scikit-image that
``irbis models check`` does not score (:data:`CALIBRATION_PHOTOS`: the agreement is measured on
other images than those that set the ranges).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
#: scikit-image photographs that set the ranges (grey ones repeated over three channels).
CALIBRATION_PHOTOS = ("camera", "coins", "grass", "gravel", "brick", "clock", "moon", "hubble_deep_field",
                      "immunohistochemistry", "retina")
CROPS_PER_PHOTO = 8
#: The one file of a folder written by :func:`write_rows`.
ROWS_FILE = "rows.npy"
#: The one file of a folder written by :func:`write_texts`.
TEXTS_FILE = "texts.json"


@dataclass(frozen=True)
class Calibration:
    """A calibration sample: ``key`` changes when the sample does; ``batch(shape)`` reads it."""

    key: str
    batch: Callable[[tuple[int, ...]], np.ndarray]


def random_crops(photos: list[np.ndarray], spec: Any, per_photo: int, seed: int) -> np.ndarray:
    """Random crops (60-100% of each side, half of them mirrored) of ``photos``, preprocessed by ``spec``."""
    from irbis.extras import load
    from irbis.kernels.image.network_input import preprocess_rgb

    cv2 = load("cv2", "images")
    rng = np.random.default_rng(seed)
    batch = []
    for rgb in photos:
        h, w = rgb.shape[:2]
        for _ in range(per_photo):
            ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
            y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
            crop = np.ascontiguousarray(rgb[y:y + ch, x:x + cw])
            batch.append(preprocess_rgb(cv2.flip(crop, 1) if rng.random() < 0.5 else crop, spec))
    return np.stack(batch)


def calibration_photos() -> list[np.ndarray]:
    """The :data:`CALIBRATION_PHOTOS` as RGB uint8 arrays."""
    from irbis.extras import load

    data = load("skimage.data", "images")

    photos = [getattr(data, name)() for name in CALIBRATION_PHOTOS]
    return [np.repeat(p[..., None], 3, axis=2) if p.ndim == 2 else p for p in photos]


def make_calibration(folder: str, spec: Any | None) -> Calibration:
    """The sample of ``folder`` (empty: the shipped photographs), images preprocessed by ``spec``.

    ``spec`` is the repository model's preprocessing (None for other networks, which then need a
    folder of ``.npy`` rows). Raises ``ValueError`` for a missing or empty folder, or images without
    a ``spec``.
    """
    if not folder:
        if spec is None:
            raise ValueError("precision='int8' needs calibrationData for a network outside the repository: "
                             "a folder of .npy arrays of preprocessed input rows")
        key = hashlib.sha256(repr((CALIBRATION_PHOTOS, CROPS_PER_PHOTO, spec)).encode()).hexdigest()[:16]
        return Calibration(key, lambda shape: _checked(random_crops(calibration_photos(), spec, CROPS_PER_PHOTO, 1),
                                                       shape, "the shipped calibration photographs"))
    files = calibration_files(folder)
    if spec is None and any(f.suffix.lower() != ".npy" for f in files):
        raise ValueError(f"calibrationData {folder!r} holds images, but the network is not a repository model "
                         "(whose preprocessing would prepare them): give .npy arrays of preprocessed input rows")
    digest = hashlib.sha256(repr(spec).encode())
    for f in files:
        digest.update(f.name.encode() + f.read_bytes())
    return Calibration(digest.hexdigest()[:16], lambda shape: _read(files, spec, shape, folder))


def write_rows(rows: np.ndarray, cache_dir: Path | None = None) -> str:
    """Write ``rows`` (N, *input) as a calibration folder named by their content; return its path.

    The folder (``<cache>/calibration/<sha256>``, beside the other cached artefacts) is written once
    per content: equal rows give the same folder, so the same quantised network.
    """
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    digest = hashlib.sha256(repr(rows.shape).encode() + rows.tobytes()).hexdigest()[:24]
    return _write_folder(digest, ROWS_FILE, lambda path: np.save(path, rows, allow_pickle=False), cache_dir)


def write_texts(texts: list[str], cache_dir: Path | None = None) -> str:
    """Write ``texts`` as a calibration folder of texts (:data:`TEXTS_FILE`, a JSON list) named by their
    content; return its path (as :func:`write_rows`)."""
    data = json.dumps(list(texts), ensure_ascii=False).encode()
    digest = hashlib.sha256(data).hexdigest()[:24]
    return _write_folder(digest, TEXTS_FILE, lambda path: path.write_bytes(data), cache_dir)


def _write_folder(digest: str, name: str, write: Callable[[Path], Any], cache_dir: Path | None) -> str:
    """``<cache>/calibration/<digest>/<name>``, written by ``write`` once (atomically); the folder's path."""
    from irbis.models import default_cache_dir

    target = (cache_dir or default_cache_dir()) / "calibration" / digest
    if not (target / name).exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=target.parent))
        write(staging / name)
        try:
            os.replace(staging, target)
        except OSError:  # another process wrote the same folder first
            (staging / name).unlink()
            staging.rmdir()
    return str(target)


def default_calibration_texts(count: int = 128) -> list[str]:
    """English prose that ships with Python itself: ``count`` of the longer paragraphs of its documentation
    topics (``pydoc_data``), the texts that set a text network's int8 ranges when no ``calibrationData`` is
    given. Paragraphs of at least 12 words that are mostly letters; of the ``3 x count`` longest, every third.

    On all_minilm_l6_v2 these keep the held-out drug reviews' embeddings close to fp32 (cosine above 0.99 on
    average), and a sample of one's own texts (a DataFrame as ``calibrationData``) keeps them closer
    (``benchmarks/text.py`` measures both: ``benchmarks/results/text.txt``)."""
    import re
    from pydoc_data.topics import topics

    paragraphs = re.split(r"\n\s*\n", "\n\n".join(topics[k] for k in sorted(topics)))
    prose = [p.strip() for p in paragraphs
             if len(p.split()) >= 12 and sum(c.isalpha() or c.isspace() for c in p) > 0.85 * len(p)]
    return sorted(prose, key=len)[-3 * count::3][:count]


def text_calibration(folder: str) -> tuple[str, list[str]]:
    """The calibration texts of ``folder`` (a :func:`write_texts` folder, or ``.txt`` files, one text each;
    empty: :func:`default_calibration_texts`) and a key that changes when they do."""
    if not folder:
        texts = default_calibration_texts()
    else:
        root = Path(folder)
        if (root / TEXTS_FILE).is_file():
            texts = [str(t) for t in json.loads((root / TEXTS_FILE).read_text())]
        elif root.is_dir():
            texts = [f.read_text(errors="replace") for f in sorted(root.glob("*.txt"))]
        else:
            raise ValueError(f"calibrationData {folder!r} is not a folder: give a folder of .txt files, or a "
                             "DataFrame of texts")
        if not texts:
            raise ValueError(f"calibrationData {folder!r} holds no texts ({TEXTS_FILE} or .txt files): int8 "
                             "calibration needs a sample of real texts")
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16], texts


def calibration_files(folder: str, texts: bool = False) -> list[Path]:
    """The images and ``.npy`` files of ``folder`` (with ``texts``, also ``.txt`` files and :data:`TEXTS_FILE`),
    sorted; a missing or empty folder is a ``ValueError``."""
    root = Path(folder)
    kinds = "images, .npy arrays or texts" if texts else "images or .npy arrays"
    if not root.is_dir():
        raise ValueError(f"calibrationData {folder!r} is not a folder: give a folder of {kinds}")
    suffixes = IMAGE_SUFFIXES + ((".npy", ".txt", ".json") if texts else (".npy",))
    files = sorted(f for f in root.iterdir() if f.is_file() and f.suffix.lower() in suffixes)
    if not files:
        raise ValueError(f"calibrationData {folder!r} holds none of {kinds} ({', '.join(suffixes)}): int8 "
                         "calibration needs a sample of real inputs")
    return files


def _read(files: list[Path], spec: Any | None, shape: tuple[int, ...], folder: str) -> np.ndarray:
    from irbis.extras import load
    from irbis.kernels.image.network_input import preprocess_rgb

    cv2 = load("cv2", "images")
    rows: list[np.ndarray] = []
    for f in files:
        if f.suffix.lower() == ".npy":
            a = np.load(f, allow_pickle=False).astype(np.float32)
            rows.extend(_checked(a[None] if a.shape == shape else a, shape, str(f)))
            continue
        bgr = cv2.imread(str(f), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"calibrationData: {f} is not a readable image")
        if spec is None:
            raise ValueError(f"calibrationData: {f} is an image, but the network has no preprocessing record "
                             "to read it with; give .npy input rows instead")
        rows.append(preprocess_rgb(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), spec))
    return _checked(np.stack(rows), shape, folder)


def _checked(batch: np.ndarray, shape: tuple[int, ...], where: str) -> np.ndarray:
    if batch.ndim != len(shape) + 1 or tuple(batch.shape[1:]) != tuple(shape):
        raise ValueError(f"calibrationData: {where} has shape {tuple(batch.shape)}; the network takes rows of shape "
                         f"{tuple(shape)}, so give arrays of shape (N, {', '.join(map(str, shape))}) or images")
    return np.ascontiguousarray(batch, dtype=np.float32)
