"""Requests to column values and column values to responses: pure, no web framework.

A request is a JSON object (one row) or a JSON array of objects (many rows), keyed by the
pipeline's input columns, or image files (a raw body, or multipart parts) for a pipeline with one
image input. Every value is checked against the kinds its column accepts
(:data:`irbis.kernels.chain.KINDS`); anything wrong is a :class:`RequestError` carrying the HTTP
status and a message naming the column, the row and what was expected.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from irbis.kernels.blocks import Images, Tensor, block_to_rows, mixed_shapes
from irbis.kernels.image.decode import ImageDecodeError, decode_image

__all__ = ["ALL_OUTPUTS", "Parsed", "RequestError", "check_outputs", "check_shapes", "decode_value", "encode_response",
           "json_rows", "json_value", "parse_files", "parse_json"]

#: Content types of a raw image body.
IMAGE_TYPES = ("image/", "application/octet-stream")


class RequestError(ValueError):
    """A request the server refuses: ``status`` (4xx) and a message naming the problem."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Parsed:
    """A request's rows as decoded column values, and whether it was one object (``single``)."""

    columns: dict[str, list[Any]]
    rows: int
    single: bool


def parse_json(body: bytes, inputs: dict[str, set[str]], nullable: dict[str, bool]) -> Parsed:
    """Decode a JSON request body (see the module docstring)."""
    if not body.strip():
        raise RequestError(400, "empty body: send a JSON object (one row) or an array of objects")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError(400, f"malformed JSON: {err}") from None
    single = isinstance(doc, dict)
    rows = [doc] if single else doc
    if not isinstance(rows, list) or not rows:
        raise RequestError(400, f"the body must be a JSON object (one row) or a non-empty array of "
                                f"objects, found {_json_type(doc)}")
    columns: dict[str, list[Any]] = {c: [] for c in inputs}
    for i, row in enumerate(rows):
        where = "" if single else f" (row {i})"
        if not isinstance(row, dict):
            raise RequestError(400, f"row {i} must be a JSON object keyed by column, found {_json_type(row)}")
        missing, extra = [c for c in inputs if c not in row], [c for c in row if c not in inputs]
        if missing or extra:
            raise RequestError(422, f"{'missing columns ' + str(missing) if missing else ''}"
                                    f"{'; ' if missing and extra else ''}"
                                    f"{'unknown columns ' + str(extra) if extra else ''}{where}; "
                                    f"the pipeline reads {list(inputs)}")
        for column, kinds in inputs.items():
            columns[column].append(decode_value(row[column], column, kinds, nullable[column], where))
    check_shapes(columns, inputs)
    return Parsed(columns, len(rows), single)


def parse_files(files: Sequence[tuple[str | None, bytes]], inputs: dict[str, set[str]]) -> Parsed:
    """Image files (``(field name or None, bytes)``) as rows of the pipeline's one image column."""
    images = [c for c, kinds in inputs.items() if "image" in kinds]
    if len(inputs) != 1 or len(images) != 1:
        raise RequestError(415, f"this pipeline reads {list(inputs)}, not one image column alone: send "
                                f"JSON (application/json) keyed by those columns")
    column = images[0]
    if not files:
        raise RequestError(400, f"empty body: send the image file for column {column!r}")
    unknown = [name for name, _ in files if name not in (None, column, "file")]
    if unknown:
        raise RequestError(422, f"unknown multipart fields {unknown}; send the image as {column!r}")
    values = [_image(data, column, "" if len(files) == 1 else f" (file {i})")
              for i, (_, data) in enumerate(files)]
    return Parsed({column: values}, len(values), len(values) == 1)


def decode_value(value: Any, column: str, kinds: set[str], nullable: bool, where: str = "") -> Any:
    """One JSON value of ``column`` as the pipeline takes it; :class:`RequestError` if it cannot."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        if not nullable:
            what = "null" if value is None else "NaN"
            raise RequestError(422, f"column {column!r}{where} is {what}, which the pipeline cannot take; "
                                    f"send a number")
        return None
    if isinstance(value, bool) or isinstance(value, dict):
        pass
    elif isinstance(value, (int, float)) and "number" in kinds:
        if math.isinf(value):
            raise RequestError(422, f"column {column!r}{where} is infinite; send a finite number")
        return float(value)
    elif isinstance(value, list) and "vector" in kinds:
        return _vector(value, column, where, nullable)
    elif isinstance(value, str) and "image" in kinds:
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(422, f"column {column!r}{where} must hold an image as base64 text; "
                                    f"the value is not base64") from None
        return _image(data, column, where)
    elif isinstance(value, str) and "string" in kinds:
        return value
    expected = " or ".join(_KIND_TEXT[k] for k in sorted(kinds))
    raise RequestError(422, f"column {column!r}{where} must be {expected}, found {_json_type(value)}")


_KIND_TEXT = {"number": "a number", "vector": "a list of numbers", "string": "a string",
              "image": "an image (base64 text)"}


def _vector(value: list[Any], column: str, where: str, nullable: bool) -> np.ndarray:
    flat = value
    while flat and all(isinstance(v, list) for v in flat):
        flat = [x for v in flat for x in v]
    if not flat or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise RequestError(422, f"column {column!r}{where} must be a non-empty list of numbers")
    try:
        array = np.asarray(value, np.float64)
    except ValueError:
        raise RequestError(422, f"column {column!r}{where}: nested lists of different lengths") from None
    if not np.isfinite(array).all() and not nullable:
        raise RequestError(422, f"column {column!r}{where} holds NaN or infinite values, which the "
                                f"pipeline cannot take")
    return array


def _image(data: bytes, column: str, where: str) -> np.ndarray:
    try:
        return decode_image(data)
    except ImageDecodeError as err:
        raise RequestError(422, f"column {column!r}{where}: undecodable image: {err}") from None


def check_shapes(columns: dict[str, list[Any]], inputs: dict[str, set[str]]) -> None:
    """Refuse (422) a decoded tensor column whose rows have more than one shape (images may differ)."""
    for column, values in columns.items():
        message = mixed_shapes(column, {v.shape for v in values
                                        if isinstance(v, np.ndarray) and "image" not in inputs[column]})
        if message:
            raise RequestError(422, message)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def encode_response(outputs: dict[str, list[Any]], single: bool) -> bytes:
    """The response body: one object for a one-object request, an array of objects otherwise."""
    names = list(outputs)
    rows = [dict(zip(names, values)) for values in zip(*outputs.values())]
    return json.dumps(rows[0] if single else rows, allow_nan=False, separators=(",", ":")).encode()


#: The ``outputs`` value (``--outputs all``) that answers with every column the pipeline writes.
ALL_OUTPUTS = "all"


def check_outputs(produced: Sequence[str], outputs: Sequence[str] | None, default: Sequence[str]) -> list[str]:
    """The columns a response carries: ``outputs`` (each one the pipeline writes); ``["all"]``: every column
    the pipeline writes; none: ``default`` (the last stage's output columns)."""
    produced = list(dict.fromkeys(produced))
    if not outputs:
        return list(dict.fromkeys(default)) or produced
    if list(outputs) == [ALL_OUTPUTS]:
        return produced
    unknown = [c for c in outputs if c not in produced]
    if unknown:
        raise ValueError(f"--outputs names {unknown}, which the pipeline does not produce; it writes {produced} "
                         f"(or --outputs {ALL_OUTPUTS} for every one)")
    return list(dict.fromkeys(outputs))


def json_rows(block: Any) -> list[Any]:
    """A block as JSON values: vectors as lists, NaN as null, images as dicts with base64 data."""
    if isinstance(block, Images):
        return [None if r is None else {**r, "data": base64.b64encode(r["data"]).decode()}
                for r in block_to_rows(block)]
    rows = block_to_rows(block) if isinstance(block, Tensor) or not isinstance(block, np.ndarray) else block
    return [json_value(v) for v in rows]


def json_value(value: Any) -> Any:
    """One value as JSON takes it (vectors and arrays as lists, bytes as base64, NaN as null)."""
    if value is None:
        return None
    if hasattr(value, "toArray"):
        value = value.toArray()
    if isinstance(value, np.ndarray):
        return [json_value(v) for v in value.tolist()] if value.ndim else json_value(value.item())
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (np.floating, float)):
        return None if value != value else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
