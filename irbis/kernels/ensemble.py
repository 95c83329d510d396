"""Group-wise ensembling of numbers and vectors over rows that share keys.

Pure counterpart of :class:`irbis.ml.EnsembleByKey` (camera bursts, augmented copies of one
image, several models' scores for one item). Semantics, the same on pandas and on Spark:

* rows with equal keys form a group; a missing key (``None``) is a key value of its own;
* numbers: missing values (``None`` and NaN alike, since pandas cannot tell them apart) are
  ignored; a group with no value gives ``None``;
* vectors are combined element-wise; missing vectors are ignored, NaN elements propagate;
  vectors of different lengths within a group raise ``ValueError`` naming the column;
* ``collapse_group=True`` returns one row per group (keys + results, groups in order of first
  appearance); ``False`` keeps every row and appends its group's results.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

ENSEMBLE_STRATEGIES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "mean": lambda a: a.mean(axis=0),
    "sum": lambda a: a.sum(axis=0),
    "max": lambda a: a.max(axis=0),
    "min": lambda a: a.min(axis=0),
}


def check_strategy(strategy: str) -> str:
    """Return ``strategy`` if it is registered in ``ENSEMBLE_STRATEGIES``, else raise."""
    if strategy not in ENSEMBLE_STRATEGIES:
        raise ValueError(
            f"strategy must be one of {sorted(ENSEMBLE_STRATEGIES)}, found {strategy!r}"
        )
    return strategy


def default_output_names(cols: Sequence[str], strategy: str) -> list[str]:
    """Output column names when none are given: ``"<strategy>(<col>)"``."""
    return [f"{strategy}({c})" for c in cols]


def _is_missing(value: Any) -> bool:
    return value is None or (np.isscalar(value) and bool(pd.isna(value)))


def combine_values(values: Sequence[Any], strategy: str, column: str, is_vector: bool) -> Any:
    """Combine one group's values of one column with ``strategy``.

    Parameters
    ----------
    values : sequence
        The group's cells: numbers, or array-likes for vector columns; ``None`` is skipped.
    strategy : str
        A key of ``ENSEMBLE_STRATEGIES``.
    column : str
        Column name, for error messages.
    is_vector : bool
        Whether the cells are vectors (combined element-wise).

    Returns
    -------
    float, numpy.ndarray or None
        ``None`` when the group holds no value.
    """
    reduce = ENSEMBLE_STRATEGIES[check_strategy(strategy)]
    present = [v for v in values if not _is_missing(v)]
    if not present:
        return None
    if not is_vector:
        return float(reduce(np.asarray(present, dtype=np.float64)))
    arrays = [np.asarray(v.toArray() if hasattr(v, "toArray") else v, dtype=np.float64).reshape(-1) for v in present]
    sizes = {a.shape[0] for a in arrays}
    if len(sizes) > 1:
        raise ValueError(
            f"column {column!r}: vectors of different lengths {sorted(sizes)} in one group; "
            "every vector of a group must have the same length"
        )
    return reduce(np.stack(arrays))


def is_vector_column(series: pd.Series) -> bool:
    """Whether a pandas column holds vectors (array-likes) rather than numbers."""
    for value in series:
        if not _is_missing(value):
            return not np.isscalar(value)
    return False


def ensemble_frame(
    frame: pd.DataFrame,
    keys: Sequence[str],
    cols: Sequence[str],
    col_names: Sequence[str] | None = None,
    strategy: str = "mean",
    collapse_group: bool = True,
) -> pd.DataFrame:
    """Ensemble ``cols`` over rows of ``frame`` sharing ``keys``.

    Returns one row per group (``collapse_group=True``: keys then results) or ``frame``
    with the results appended (``False``). Vector results are numpy arrays.

    Examples
    --------
    >>> df = pd.DataFrame({"k": [1, 1, 2], "x": [1.0, 3.0, 5.0]})
    >>> ensemble_frame(df, ["k"], ["x"])["mean(x)"].tolist()
    [2.0, 5.0]
    """
    check_strategy(strategy)
    names = list(col_names) if col_names else default_output_names(cols, strategy)
    if len(names) != len(cols):
        raise ValueError(f"colNames has {len(names)} names for {len(cols)} cols; give one per column")
    missing = [c for c in [*keys, *cols] if c not in frame.columns]
    if missing:
        raise ValueError(f"columns {missing} not found; available: {list(frame.columns)}")
    group_ids = frame.groupby(list(keys), dropna=False, sort=False).ngroup().to_numpy()
    n_groups = int(group_ids.max()) + 1 if len(group_ids) else 0
    members = [np.flatnonzero(group_ids == g) for g in range(n_groups)]
    results = {}
    for col, name in zip(cols, names):
        cells = frame[col].tolist()
        vec = is_vector_column(frame[col])
        results[name] = [combine_values([cells[i] for i in rows], strategy, col, vec) for rows in members]
    if collapse_group:
        firsts = [rows[0] for rows in members]
        out = frame[list(keys)].iloc[firsts].reset_index(drop=True)
        for name, values in results.items():
            out[name] = pd.Series(values, dtype=object if values and _any_array(values) else None)
        return out
    out = frame.reset_index(drop=True).copy()
    for name, values in results.items():
        out[name] = [values[g] for g in group_ids]
    return out


def _any_array(values: Sequence[Any]) -> bool:
    return any(isinstance(v, np.ndarray) for v in values)
