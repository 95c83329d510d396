"""Training-time image augmentation: random operations drawn per image from a seeded generator.

An augmentation is a JSON list of op dicts, in the vocabulary of :class:`~irbis.kernels.image.op_chain.ImageChain`
(``{"op": name, argument: value, ...}``; ``flip`` takes the same ``flip_code``), each with an optional
probability ``p`` (default 1)::

    [{"op": "random_resized_crop", "scale": [0.5, 1.0]},
     {"op": "flip", "flip_code": 1, "p": 0.5},
     {"op": "rotate", "degrees": 10},
     {"op": "color_jitter", "brightness": 0.2, "contrast": 0.2},
     {"op": "grey", "p": 0.2}]

How an image becomes a training input (:func:`augment_rgb`): the geometry first, at the network's input
size (``random_resized_crop`` when the list has it, else the model's own resize and centre crop, the one
geometry of :func:`~irbis.kernels.image.network_input.fit_geometry`), then the other ops in their order on the
small image, then the model's colour order and normalisation. Validation rows and inference get the
geometry and normalisation alone, exactly as :func:`~irbis.kernels.image.network_input.preprocess_rgb`.

``grey`` is what infrared camera traps record at night: the photo in grey levels, kept as three equal
channels, so that a network trained on daylight frames also sees night ones.

Examples
--------
>>> import numpy as np
>>> from irbis.models import get_entry
>>> ops = parse_augmentation('[{"op": "flip", "flip_code": 1, "p": 0.5}, {"op": "grey", "p": 0.3}]')
>>> augment_rgb(np.zeros((300, 400, 3), np.uint8), get_entry("efficientnet_lite0").preprocessing, ops,
...             np.random.default_rng(0)).shape
(3, 224, 224)
"""
from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from irbis.extras import optional
from irbis.kernels.image.network_input import finish_rgb, fit_geometry
from irbis.kernels.image.ops import as_hwc, flip
from irbis.models.preprocess import Preprocessing

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

__all__ = ["AUGMENT_OPS", "augment_rgb", "parse_augmentation"]

#: Each op's arguments: name -> (kind, default). Kinds: "prob" in [0, 1], "nonneg" >= 0,
#: "range" two numbers low <= high in (0, ...), or a tuple of allowed values.
AUGMENT_OPS: dict[str, dict[str, tuple[Any, Any]]] = {
    "random_resized_crop": {"scale": ("range", [0.5, 1.0]), "ratio": ("range", [3 / 4, 4 / 3])},
    "flip": {"flip_code": ((-1, 0, 1), 1)},
    "rotate": {"degrees": ("nonneg", 10.0)},
    "color_jitter": {"brightness": ("nonneg", 0.2), "contrast": ("nonneg", 0.2)},
    "grey": {},
}


def _is_num(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _check(name: str, key: str, kind: Any, value: Any) -> Any:
    if isinstance(kind, tuple):
        ok = value in kind and not isinstance(value, bool)
        want = f"one of {list(kind)}"
    elif kind == "prob":
        ok, want = _is_num(value) and 0 <= value <= 1, "a probability in [0, 1]"
    elif kind == "nonneg":
        ok, want = _is_num(value) and value >= 0, "a number >= 0"
    else:
        ok = (isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_num(v) for v in value)
              and 0 < value[0] <= value[1])
        want = "[low, high] with 0 < low <= high"
        value = list(value) if ok else value
    if not ok:
        raise ValueError(f"augmentation op {name!r}: {key}={value!r} is invalid; expected {want}")
    return value


def parse_augmentation(value: str | Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Validate an augmentation list (JSON text or a list of dicts); return it with every argument filled in.

    Raises ``ValueError`` naming the op and the argument for an unknown op, argument or value.
    """
    if value is None or value == "":
        return []
    ops = json.loads(value) if isinstance(value, str) else value
    if not isinstance(ops, list):
        raise ValueError(f"augmentation must be a JSON list of op dicts, found {value!r}")
    out = []
    for op in ops:
        if not isinstance(op, Mapping) or "op" not in op:
            raise ValueError(f"each augmentation step must be a dict with an 'op' key, found {op!r}")
        name = op["op"]
        if name not in AUGMENT_OPS:
            raise ValueError(f"unknown augmentation op {name!r}; expected one of {sorted(AUGMENT_OPS)}")
        spec = {**AUGMENT_OPS[name], "p": ("prob", 1.0)}
        unknown = sorted(set(op) - set(spec) - {"op"})
        if unknown:
            raise ValueError(f"augmentation op {name!r}: unknown arguments {unknown}; expected {sorted(spec)}")
        out.append({"op": name,
                    **{k: _check(name, k, kind, op.get(k, default)) for k, (kind, default) in spec.items()}})
    if sum(op["op"] == "random_resized_crop" for op in out) > 1:
        raise ValueError("augmentation: random_resized_crop may appear once (it is the geometry)")
    return out


def _random_resized_crop(img: np.ndarray, op: Mapping[str, Any], spec: Preprocessing,
                         rng: np.random.Generator) -> np.ndarray:
    """torchvision's RandomResizedCrop: a window of a random share of the area and aspect ratio, resized to
    the input size (after 10 tries, the centre window of the nearest allowed ratio)."""
    h, w = img.shape[:2]
    area = h * w
    lo, hi = (math.log(r) for r in op["ratio"])
    for _ in range(10):
        target = area * rng.uniform(*op["scale"])
        ratio = math.exp(rng.uniform(lo, hi))
        cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            break
    else:
        ratio = min(max(w / h, op["ratio"][0]), op["ratio"][1])
        cw, ch = (w, int(round(w / ratio))) if w / h < ratio else (int(round(h * ratio)), h)
        cw, ch = min(cw, w), min(ch, h)
        y, x = (h - ch) // 2, (w - cw) // 2
    height, width = spec.input_size
    return as_hwc(cv2.resize(img[y:y + ch, x:x + cw], (width, height), interpolation=cv2.INTER_LINEAR))


def _rotate(img: np.ndarray, degrees: float, rng: np.random.Generator) -> np.ndarray:
    angle = rng.uniform(-degrees, degrees)
    h, w = img.shape[:2]
    matrix = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 1.0)
    return as_hwc(cv2.warpAffine(img, matrix, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101))


def _color_jitter(img: np.ndarray, brightness: float, contrast: float, rng: np.random.Generator) -> np.ndarray:
    """Pixel values times a brightness factor, then stretched about the image's mean by a contrast factor,
    each drawn from [1 - x, 1 + x] (torchvision's ColorJitter for these two)."""
    b = rng.uniform(max(0.0, 1 - brightness), 1 + brightness)
    c = rng.uniform(max(0.0, 1 - contrast), 1 + contrast)
    out = img.astype(np.float32) * np.float32(b)
    mean = out.mean()
    out = (out - mean) * np.float32(c) + mean
    return np.clip(out, 0, 255).astype(np.uint8)


def _grey(img: np.ndarray) -> np.ndarray:
    if img.shape[2] == 1:
        return img
    grey = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY)
    return np.repeat(grey[:, :, None], img.shape[2], axis=2)


def augment_rgb(image: np.ndarray, spec: Preprocessing, ops: Sequence[Mapping[str, Any]],
                rng: np.random.Generator) -> np.ndarray:
    """One RGB (or grey) uint8 image, augmented by ``ops`` (from :func:`parse_augmentation`) with draws from
    ``rng``, as the network's float32 CHW input under ``spec``.

    Every op draws its coin (and its parameters) from ``rng`` in the list's order, so one generator
    gives one result whatever the image.
    """
    image = as_hwc(np.asarray(image))
    crop = next((op for op in ops if op["op"] == "random_resized_crop"), None)
    if crop is not None and rng.random() < crop["p"]:
        image = _random_resized_crop(image, crop, spec, rng)
    else:
        image = fit_geometry(image, spec)
    for op in ops:
        name = op["op"]
        if name == "random_resized_crop" or rng.random() >= op["p"]:
            continue
        if name == "flip":
            image = flip(image, op["flip_code"])
        elif name == "rotate":
            image = _rotate(image, op["degrees"], rng)
        elif name == "color_jitter":
            image = _color_jitter(image, op["brightness"], op["contrast"], rng)
        elif name == "grey":
            image = _grey(image)
    return finish_rgb(as_hwc(image), spec)
