"""Vector assembly: concatenate numeric and vector columns into one vector per row.

Pure kernels behind :class:`irbis.ml.FastVectorAssembler`. ``assemble_frame`` runs the
assembly on a pandas frame (tests, small data, the HTTP server); ``assembled_attributes``
builds the ``ml_attr`` metadata that SparkML's ``VectorAssembler`` attaches to its output,
so models downstream (trees, ``OneHotEncoder`` consumers, feature importances) see the same
feature names whichever assembler produced the column.

Invalid values (``None`` or NaN) are handled as ``VectorAssembler`` does:

* ``"error"``: raise a ``ValueError`` naming the column,
* ``"skip"``: drop the row,
* ``"keep"``: keep the row; missing numbers become NaN and a missing vector becomes NaNs.

As in ``VectorAssembler``, NaN *inside* a vector is a value, not an invalid entry.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

HANDLE_INVALID = ("error", "skip", "keep")


@dataclass(frozen=True)
class InputSpec:
    """One input column of an assembly.

    Parameters
    ----------
    name : str
        Column name.
    size : int
        Number of slots it fills: 1 for a number, the vector length for a vector.
    is_vector : bool
        Whether the column holds vectors.
    attrs : list of dict or None
        The column's own ``ml_attr`` attributes (nominal, binary or numeric), if it has any.
    """

    name: str
    size: int
    is_vector: bool = False
    attrs: tuple[Mapping[str, Any], ...] | None = None


def check_handle_invalid(value: str) -> str:
    """Return ``value`` if it is a known invalid-value policy, else raise ``ValueError``."""
    if value not in HANDLE_INVALID:
        raise ValueError(f"handleInvalid must be one of {HANDLE_INVALID}, found {value!r}")
    return value


def _slot_name(spec: InputSpec, i: int, attr: Mapping[str, Any] | None) -> str:
    if not spec.is_vector:
        return spec.name
    if attr is not None and attr.get("name"):
        return f"{spec.name}_{attr['name']}"
    return f"{spec.name}_{i}"


def assembled_attributes(specs: Sequence[InputSpec]) -> dict[str, Any]:
    """Build the ``ml_attr`` metadata of the assembled vector, as ``VectorAssembler`` does.

    Numeric inputs become numeric attributes named after the column; slots of a vector
    input are named ``<column>_<attribute name>`` (or ``<column>_<index>`` without
    attribute names); nominal and binary attributes keep their values.

    Parameters
    ----------
    specs : sequence of InputSpec
        Input columns in assembly order.

    Returns
    -------
    dict
        ``{"ml_attr": {"attrs": {...}, "num_attrs": n}}``, ready for Spark column metadata.

    Examples
    --------
    >>> assembled_attributes([InputSpec("a", 1), InputSpec("v", 2, True)])["ml_attr"]["num_attrs"]
    3
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    idx = 0
    for spec in specs:
        own = list(spec.attrs) if spec.attrs else []
        for i in range(spec.size):
            attr = own[i] if i < len(own) else None
            kind = (attr or {}).get("type", "numeric")
            entry = {k: v for k, v in (attr or {}).items() if k not in ("idx", "name", "type")}
            entry.update(idx=idx, name=_slot_name(spec, i, attr))
            groups.setdefault(kind, []).append(entry)
            idx += 1
    return {"ml_attr": {"attrs": groups, "num_attrs": idx}}


def unknown_size_message(name: str) -> str:
    """The error of a vector column whose nulls ``handleInvalid='keep'`` must fill with NaN, when the size of
    its vectors is known neither from its metadata nor from any value (as ``VectorAssembler`` refuses it)."""
    return (f"FastVectorAssembler: column {name!r} holds only nulls and no ml_attr size, so the NaNs that "
            "handleInvalid='keep' puts in its place have no known length; add the size with "
            "pyspark.ml.feature.VectorSizeHint, or set handleInvalid to 'skip' or 'error'")


def _as_vector(value: Any, spec: InputSpec) -> np.ndarray | None:
    if value is None or (np.isscalar(value) and pd.isna(value)):
        return None
    arr = np.asarray(value.toArray() if hasattr(value, "toArray") else value, dtype=np.float64).reshape(-1)
    if arr.shape[0] != spec.size:
        raise ValueError(
            f"column {spec.name!r}: expected vectors of size {spec.size}, found size "
            f"{arr.shape[0]}; make every vector of the column the same length"
        )
    return arr


def _column_block(series: pd.Series, spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    """Return an (n, size) float block for one input column and its invalid-row mask."""
    if not spec.is_vector:
        values = pd.to_numeric(series, errors="raise").to_numpy(dtype=np.float64, na_value=np.nan)
        return values[:, None], np.isnan(values)
    block = np.full((len(series), spec.size), np.nan)
    missing = np.zeros(len(series), dtype=bool)
    for row, value in enumerate(series.tolist()):
        vec = _as_vector(value, spec)
        if vec is None:
            missing[row] = True
        else:
            block[row] = vec
    return block, missing


def assemble_frame(
    frame: pd.DataFrame, specs: Sequence[InputSpec], handle_invalid: str = "error"
) -> tuple[np.ndarray, np.ndarray]:
    """Assemble the input columns of ``frame`` into a 2-D float array.

    Parameters
    ----------
    frame : pandas.DataFrame
        Holds the input columns; vector cells are array-likes of floats (or ``None``).
    specs : sequence of InputSpec
        Input columns in assembly order.
    handle_invalid : {"error", "skip", "keep"}
        What to do with ``None`` or NaN values (see the module docstring).

    Returns
    -------
    values : numpy.ndarray
        ``(rows kept, total size)`` float64 array.
    keep : numpy.ndarray
        Boolean mask over the rows of ``frame``: which rows were kept.
    """
    check_handle_invalid(handle_invalid)
    width = sum(s.size for s in specs)
    pairs = [_column_block(frame[s.name], s) for s in specs]
    blocks = [block for block, _ in pairs]
    values = np.concatenate(blocks, axis=1) if blocks else np.zeros((len(frame), width))
    invalid = np.zeros(len(frame), dtype=bool)
    for _, missing in pairs:
        invalid |= missing
    if handle_invalid == "error" and invalid.any():
        for spec, (_, missing) in zip(specs, pairs):
            if missing.any():
                raise ValueError(
                    f"column {spec.name!r} holds null or NaN values; set handleInvalid to "
                    "'skip' to drop those rows or 'keep' to output NaN"
                )
    keep = ~invalid if handle_invalid == "skip" else np.ones(len(frame), dtype=bool)
    return values[keep], keep
