"""Automatic featurisation of mixed columns into one numeric vector.

Pure kernels behind :class:`irbis.ml.Featurize`. Fitting reduces each column to a few
statistics (``column_stats``) and turns them into a JSON *plan* (``build_column_plan``);
transforming applies the plan to a pandas batch (``transform_frame``). Spark computes the
same statistics with its own aggregates, so both runtimes share the plan and the transform.

Per column kind (slots in output order):

============  ===========================================================================
numeric       the value; missing (None/NaN) is imputed with the training mean
boolean       1.0 / 0.0; missing is imputed with the training frequency of ``True``
categorical   strings with at most ``max_categories`` distinct training values: one-hot
              over the levels (most frequent first) plus one slot for unseen values
hashed        strings with more distinct values: one-hot over ``num_hash_buckets`` slots
              chosen by MurmurHash3 of the string
vector        the elements; a missing vector (or NaN element) is imputed with the training
              mean vector (0 where that mean is not finite)
date          year, month, day of month, day of week (Monday=0); missing: training mean date
timestamp     the date parts plus hour, minute, second
============  ===========================================================================

Every column that had missing values in training also gets a ``<column>_missing`` flag slot
(1.0 where the value was imputed). Missing strings put no 1.0 in their one-hot slots.

A numeric column planned with ``impute=False`` (SynapseML's ``imputeMissing=False``) is neither
imputed nor flagged: a missing value is *invalid*, and ``invalid`` says what the transform does
with it, as SynapseML's final assembler does (its ``handleInvalid``): ``"keep"`` writes NaN in the
slot, ``"error"`` raises naming the column, ``"skip"`` drops the row (:func:`invalid_rows` finds
those rows; the caller drops them before the transform).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from irbis.kernels.text_features import term_index

COLUMN_KINDS = ("numeric", "boolean", "categorical", "hashed", "vector", "date", "timestamp")
DATE_PARTS = ("year", "month", "day", "weekday")
TIME_PARTS = DATE_PARTS + ("hour", "minute", "second")
OTHER_LEVEL = "__other__"


def is_missing(value: Any) -> bool:
    """Whether one cell is missing: ``None``, NaN, ``NaT`` or ``pd.NA`` (never an array)."""
    if value is None:
        return True
    if isinstance(value, str) or (not np.isscalar(value) and hasattr(value, "__len__")):
        return False
    return bool(pd.isna(value))


def as_vector(value: Any) -> np.ndarray:
    """A vector cell as a flat float array (numpy arrays, lists, or Spark ML vectors)."""
    if hasattr(value, "toArray"):
        value = value.toArray()
    return np.asarray(value, dtype=np.float64).reshape(-1)


def _missing_mask(series: pd.Series) -> np.ndarray:
    return np.asarray([is_missing(v) for v in series], dtype=bool)


def _epoch_seconds(series: pd.Series) -> np.ndarray:
    stamps = pd.to_datetime(pd.Series(list(series), dtype=object), errors="coerce")
    if getattr(stamps.dt, "tz", None) is not None:
        stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
    seconds = (stamps - pd.Timestamp(0)) / pd.Timedelta(seconds=1)
    return seconds.to_numpy(dtype=np.float64, na_value=np.nan)


def column_stats(series: pd.Series, kind: str) -> dict[str, Any]:
    """Training statistics of one column, as ``build_column_plan`` expects them.

    ``kind`` is ``"numeric"``, ``"boolean"``, ``"string"``, ``"vector"``, ``"date"`` or
    ``"timestamp"`` (strings become categorical or hashed in the plan).
    """
    missing = _missing_mask(series)
    present = series[~missing]
    stats: dict[str, Any] = {"n_missing": int(missing.sum())}
    if kind in ("numeric", "boolean"):
        values = present.astype(np.float64)
        stats["mean"] = float(values.mean()) if len(values) else 0.0
    elif kind == "string":
        counts = present.astype(str).value_counts()
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        stats["distinct"] = len(ordered)
        stats["top"] = [k for k, _ in ordered]
    elif kind == "vector":
        arrays = [as_vector(v) for v in present]
        stats["size"] = arrays[0].shape[0] if arrays else 0
        stats["mean"] = np.mean(np.stack(arrays), axis=0).tolist() if arrays else []
    elif kind in ("date", "timestamp"):
        seconds = _epoch_seconds(present)
        stats["mean"] = float(np.nanmean(seconds)) if len(seconds) else 0.0
    else:
        raise ValueError(f"unknown column kind {kind!r}")
    return stats


def build_column_plan(
    name: str, kind: str, stats: Mapping[str, Any], max_categories: int, num_hash_buckets: int,
    impute: bool = True,
) -> dict[str, Any]:
    """Turn one column's statistics into its JSON plan entry; ``impute=False`` leaves a numeric column's
    missing values unimputed and unflagged (invalid, see :func:`transform_column`)."""
    plan: dict[str, Any] = {"name": name, "flag": bool(stats.get("n_missing", 0) > 0)}
    if kind == "numeric" and not impute:
        plan.update(kind=kind, fill=_finite(stats["mean"]), flag=False, impute=False)
    elif kind == "string":
        if stats["distinct"] <= max_categories:
            plan.update(kind="categorical", levels=list(stats["top"]))
        else:
            plan.update(kind="hashed", buckets=int(num_hash_buckets))
    elif kind == "vector":
        plan.update(kind="vector", size=int(stats["size"]), fill=[_finite(v) for v in stats["mean"]])
    else:
        plan.update(kind=kind, fill=_finite(stats["mean"]))
    return plan


def _finite(value: float) -> float:
    """Imputation values must be finite numbers (NaN cannot cross Arrow inside a vector)."""
    value = float(value)
    return value if np.isfinite(value) else 0.0


def slot_names(plan: Mapping[str, Any]) -> list[str]:
    """Names of the output slots of one column plan (used for ``ml_attr`` metadata)."""
    name, kind = plan["name"], plan["kind"]
    if kind in ("numeric", "boolean"):
        slots = [name]
    elif kind == "categorical":
        slots = [f"{name}={lvl}" for lvl in plan["levels"]] + [f"{name}={OTHER_LEVEL}"]
    elif kind == "hashed":
        slots = [f"{name}#{i}" for i in range(plan["buckets"])]
    elif kind == "vector":
        slots = [f"{name}_{i}" for i in range(plan["size"])]
    else:
        parts = DATE_PARTS if kind == "date" else TIME_PARTS
        slots = [f"{name}_{p}" for p in parts]
    return slots + ([f"{name}_missing"] if plan["flag"] else [])


def _date_parts(seconds: np.ndarray, kind: str) -> np.ndarray:
    stamps = pd.to_datetime(seconds, unit="s")
    cols = [stamps.year, stamps.month, stamps.day, stamps.weekday]
    if kind == "timestamp":
        cols += [stamps.hour, stamps.minute, stamps.second]
    return np.stack([np.asarray(c, dtype=np.float64) for c in cols], axis=1)


def _one_hot(index: np.ndarray, width: int, missing: np.ndarray) -> np.ndarray:
    out = np.zeros((len(index), width))
    rows = np.flatnonzero(~missing)
    out[rows, index[rows]] = 1.0
    return out


def imputes(plan: Mapping[str, Any]) -> bool:
    """Whether a column plan imputes its missing values (every plan but a numeric one fitted with
    ``impute=False``)."""
    return bool(plan.get("impute", True))


def invalid_rows(frame: pd.DataFrame, plans: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """The rows of ``frame`` with an invalid value: missing in a column whose plan does not impute."""
    invalid = np.zeros(len(frame), dtype=bool)
    for plan in plans:
        if not imputes(plan):
            invalid |= _missing_mask(frame[plan["name"]])
    return invalid


def transform_column(series: pd.Series, plan: Mapping[str, Any], invalid: str = "keep") -> np.ndarray:
    """Apply one column plan: an ``(n, len(slot_names(plan)))`` float array.

    A missing value of a plan that does not impute is NaN with ``invalid="keep"`` (and ``"skip"``, whose rows
    the caller dropped) and a ``ValueError`` naming the column with ``invalid="error"``."""
    kind = plan["kind"]
    missing = _missing_mask(series)
    if not imputes(plan) and invalid == "error" and missing.any():
        raise ValueError(
            f"column {plan['name']!r} has a missing value (null or NaN) in row {int(np.argmax(missing))} of the "
            "batch and imputeMissing is False; set vectorAssemblerHandleInvalid to 'keep' (NaN in its slot) or "
            "'skip' (the row is dropped), or imputeMissing to True (the training mean)"
        )
    if kind in ("numeric", "boolean"):
        fill = plan["fill"] if imputes(plan) else np.nan
        values = np.where(missing, fill, pd.Series(series).where(~missing, 0).astype(np.float64))
        block = values[:, None]
    elif kind == "categorical":
        lookup = {lvl: i for i, lvl in enumerate(plan["levels"])}
        other = len(plan["levels"])
        index = np.asarray([lookup.get(str(v), other) if not m else 0 for v, m in zip(series, missing)])
        block = _one_hot(index.astype(np.int64), other + 1, missing)
    elif kind == "hashed":
        width = plan["buckets"]
        index = np.asarray([term_index(str(v), width) if not m else 0 for v, m in zip(series, missing)])
        block = _one_hot(index.astype(np.int64), width, missing)
    elif kind == "vector":
        block = np.tile(np.asarray(plan["fill"], dtype=np.float64), (len(series), 1))
        for row in np.flatnonzero(~missing):
            vec = as_vector(series.iloc[row])
            if vec.shape[0] != plan["size"]:
                raise ValueError(
                    f"column {plan['name']!r}: expected vectors of size {plan['size']} (as in "
                    f"training), found size {vec.shape[0]}"
                )
            block[row] = np.where(np.isnan(vec), block[row], vec)
    else:
        seconds = np.where(missing, plan["fill"], _epoch_seconds(series))
        block = _date_parts(np.nan_to_num(seconds, nan=plan["fill"]), kind)
    if plan["flag"]:
        block = np.concatenate([block, missing.astype(np.float64)[:, None]], axis=1)
    return block


def transform_frame(frame: pd.DataFrame, plans: Sequence[Mapping[str, Any]], invalid: str = "keep") -> np.ndarray:
    """Apply every column plan to ``frame`` (``invalid`` as :func:`transform_column` takes it) and concatenate:
    an ``(n, slots)`` float array."""
    blocks = [transform_column(frame[p["name"]], p, invalid) for p in plans]
    if not blocks:
        return np.zeros((len(frame), 0))
    return np.concatenate(blocks, axis=1)


def infer_kind(series: pd.Series) -> str:
    """Guess a pandas column's kind for ``column_stats`` (pandas runtime only)."""
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "boolean"
    if pd.api.types.is_numeric_dtype(dtype):
        return "numeric"
    if pd.api.types.is_datetime64_any_dtype(dtype):
        return "timestamp"
    present = [v for v in series if not is_missing(v)]
    if not present:
        return "numeric"
    first = present[0]
    if isinstance(first, bool | np.bool_):
        return "boolean"
    if isinstance(first, str):
        return "string"
    if isinstance(first, pd.Timestamp) or hasattr(first, "hour"):
        return "timestamp"
    if hasattr(first, "isoformat"):
        return "date"
    if np.isscalar(first):
        return "numeric"
    return "vector"
