"""A JSON-serialisable chain of image operations applied in one pass per image.

A chain is a list of dicts, each naming an operation of :data:`OPS` and its
arguments, e.g.::

    [{"op": "resize", "height": 256, "width": 256, "keep_aspect_ratio": true},
     {"op": "center_crop", "height": 224, "width": 224},
     {"op": "color_format", "format": "RGB"},
     {"op": "normalize", "mean": 127.0, "std": 128.0}]

Arguments are validated when the chain is built, so a typo fails on the
driver rather than in a Spark task.  The chain tracks the channel order
(GRAY/BGR/BGRA from OpenCV, changed by ``color_format``) so that a later
``color_format`` converts from the right order.

Examples
--------
>>> import numpy as np
>>> chain = ImageChain().then("resize", height=8, width=8).then("flip", flip_code=1)
>>> chain(np.zeros((4, 4, 3), np.uint8)).shape
(8, 8, 3)
>>> ImageChain.from_json(chain.to_json()) == chain
True
"""
from __future__ import annotations

import json
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from irbis.extras import optional
from irbis.kernels.image import ops
from irbis.kernels.image.ops import ImageOpError, describe

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

__all__ = ["OPS", "ImageChain", "OpSpec"]


@dataclass(frozen=True)
class OpSpec:
    """An operation: its kernel function and argument kinds.

    Kinds: ``"pos"`` positive int, ``"odd"`` positive odd int, ``"int"``,
    ``"bool"``, ``"num"`` number, ``"nums"`` number or list of numbers, or a
    tuple/dict of allowed values.
    """

    fn: Callable[..., np.ndarray]
    args: Mapping[str, Any]
    required: tuple[str, ...]


#: Registry of chain operations, by name.
OPS: dict[str, OpSpec] = {
    "resize": OpSpec(ops.resize, {"height": "pos", "width": "pos", "keep_aspect_ratio": "bool",
                                  "interpolation": ops.INTERPOLATIONS}, ("height", "width")),
    "crop": OpSpec(ops.crop, {"x": "int", "y": "int", "height": "pos", "width": "pos"},
                   ("x", "y", "height", "width")),
    "center_crop": OpSpec(ops.center_crop, {"height": "pos", "width": "pos"}, ("height", "width")),
    "flip": OpSpec(ops.flip, {"flip_code": (-1, 0, 1)}, ()),
    "blur": OpSpec(ops.blur, {"height": "odd", "width": "odd", "sigma": "num"}, ("height", "width")),
    "threshold": OpSpec(ops.threshold, {"threshold": "num", "max_val": "num",
                                        "type": ops.THRESHOLD_TYPES}, ("threshold", "max_val")),
    "color_format": OpSpec(ops.color_format, {"format": ops.COLOR_FORMATS}, ("format",)),
    "normalize": OpSpec(ops.normalize, {"mean": "nums", "std": "nums",
                                        "color_scale_factor": "num"}, ("mean", "std")),
}


def _is_num(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _kind_ok(kind: Any, v: Any) -> bool:
    is_int = isinstance(v, numbers.Integral) and not isinstance(v, bool)
    if kind == "pos":
        return is_int and v > 0
    if kind == "odd":
        return is_int and v > 0 and v % 2 == 1
    if kind == "int":
        return is_int
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "num":
        return _is_num(v)
    if kind == "nums":
        return _is_num(v) or (isinstance(v, (list, tuple)) and len(v) > 0
                              and all(_is_num(x) for x in v))
    return isinstance(v, (str, numbers.Integral)) and not isinstance(v, bool) and v in kind


def _plain(v: Any) -> Any:
    """JSON-friendly copy of an argument (tuples and numpy scalars become lists and floats)."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def validate_op(op: Mapping[str, Any]) -> dict[str, Any]:
    """Check one op dict against :data:`OPS`; return a plain-JSON copy."""
    if not isinstance(op, Mapping) or "op" not in op:
        raise TypeError(f"each chain step must be a dict with an 'op' key, found {op!r}")
    name = op["op"]
    if name not in OPS:
        raise ValueError(f"unknown image op {name!r}; expected one of {sorted(OPS)}")
    spec = OPS[name]
    args = {k: _plain(v) for k, v in op.items() if k != "op"}
    unknown = sorted(set(args) - set(spec.args))
    if unknown:
        raise ValueError(f"image op {name!r}: unknown arguments {unknown}; expected {sorted(spec.args)}")
    missing = [k for k in spec.required if k not in args]
    if missing:
        raise ValueError(f"image op {name!r}: missing arguments {missing} in {op!r}")
    for key, value in args.items():
        kind = spec.args[key]
        if not _kind_ok(kind, value):
            want = sorted(kind) if isinstance(kind, (dict, tuple)) else kind
            raise ValueError(f"image op {name!r}: argument {key}={value!r} is invalid; expected {want}")
    return {"op": name, **args}


class ImageChain:
    """An immutable list of image operations, applied to one image at a time.

    Parameters
    ----------
    ops : iterable of dict
        Steps such as ``{"op": "resize", "height": 224, "width": 224}``.
    """

    def __init__(self, ops: Iterable[Mapping[str, Any]] = ()) -> None:
        if isinstance(ops, (str, bytes)):
            raise TypeError("ImageChain takes a list of op dicts; use ImageChain.from_json for text")
        self._ops = tuple(validate_op(op) for op in ops)

    @property
    def ops(self) -> list[dict[str, Any]]:
        """The steps as a list of plain-JSON dicts (a copy)."""
        return [dict(op) for op in self._ops]

    def then(self, op: str, **args: Any) -> "ImageChain":
        """Return a new chain with one more step."""
        return ImageChain([*self._ops, {"op": op, **args}])

    def to_json(self) -> str:
        return json.dumps(self.ops)

    @classmethod
    def from_json(cls, text: str) -> "ImageChain":
        return cls(json.loads(text))

    def apply(self, img: np.ndarray, order: str | None = None) -> tuple[np.ndarray, str]:
        """Run every step; return the image and its final channel order.

        ``order`` is the input channel order (default from the channel
        count: GRAY, BGR or BGRA).
        """
        img = img[:, :, None] if img.ndim == 2 else img
        order = order or {1: "GRAY", 3: "BGR", 4: "BGRA"}.get(img.shape[2], "?")
        for step in self._ops:
            name = step["op"]
            args = {k: v for k, v in step.items() if k != "op"}
            if name == "color_format":
                args["source"] = order
            try:
                img = OPS[name].fn(img, **args)
            except ImageOpError:
                raise
            except (cv2.error, ValueError, TypeError) as exc:
                reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                call = ", ".join(f"{k}={v!r}" for k, v in args.items())
                raise ImageOpError(f"{name}({call}) on a {describe(img)} image: {reason}") from None
            if name == "color_format":
                order = args["format"]
        return img, order

    def __call__(self, img: np.ndarray, order: str | None = None) -> np.ndarray:
        return self.apply(img, order)[0]

    def __len__(self) -> int:
        return len(self._ops)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageChain) and self._ops == other._ops

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"ImageChain({self.ops!r})"
