"""Driver-side checks of the training data, run before any worker starts.

A bad row found inside the barrier stage would fail every task and make Spark
retry the stage for nothing, so one aggregate job checks nulls, feature
lengths and labels first, and a forward pass on a zero batch checks the
network against the features and the label range.
"""

from __future__ import annotations

from typing import Any

import torch
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from irbis.train.backends.spark import FEATURES, LABEL
from irbis.train.loop import TrainSpec


def data_profile(frame: DataFrame) -> dict[str, Any]:
    """Rows, null counts, feature length range and label range in one Spark job."""
    size = F.size(FEATURES)
    row = frame.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.col(LABEL).isNull().cast("int")).alias("null_labels"),
        F.sum(F.isnan(LABEL).cast("int")).alias("nan_labels"),
        F.sum(F.col(FEATURES).isNull().cast("int")).alias("null_features"),
        F.min(size).alias("min_len"), F.max(size).alias("max_len"),
        F.min(LABEL).alias("min_label"), F.max(LABEL).alias("max_label"),
        F.sum((F.col(LABEL) != F.floor(LABEL)).cast("int")).alias("fractional_labels"),
    ).first()
    return row.asDict()


def check_profile(p: dict[str, Any], spec: TrainSpec, features_col: str, label_col: str, num_workers: int) -> int:
    """Raise a ValueError naming the column for bad data; return the feature length."""
    if p["rows"] < num_workers:
        raise ValueError(f"the training data has {p['rows']} rows, fewer than numWorkers={num_workers}")
    if p["null_labels"] or p["nan_labels"]:
        raise ValueError(f"labelCol {label_col!r} has {p['null_labels'] or p['nan_labels']} null/NaN values; "
                         "drop or impute them before fitting")
    if p["null_features"]:
        raise ValueError(f"featuresCol {features_col!r} has {p['null_features']} null rows; drop them first")
    if p["min_len"] != p["max_len"]:
        raise ValueError(f"featuresCol {features_col!r} rows must all have the same length, found lengths "
                         f"from {p['min_len']} to {p['max_len']}")
    if spec.loss == "cross_entropy" and (p["fractional_labels"] or p["min_label"] < 0):
        raise ValueError(f"labelCol {label_col!r} must hold class indices 0..K-1 for loss='cross_entropy', "
                         f"found values from {p['min_label']} to {p['max_label']}"
                         + (" with fractions" if p["fractional_labels"] else ""))
    return int(p["max_len"])


def check_network(module: torch.nn.Module, spec: TrainSpec, n_features: int, max_label: float,
                  features_col: str, label_col: str) -> None:
    """Run the network on a zero batch: input shape, and output width against the labels."""
    shape = list(spec.input_shape or [n_features])
    if int(torch.tensor(shape).prod()) != n_features:
        raise ValueError(f"inputShape {shape} holds {int(torch.tensor(shape).prod())} values but "
                         f"featuresCol {features_col!r} has {n_features}")
    try:
        with torch.no_grad():
            out = module.eval()(torch.zeros(2, *shape))
    except RuntimeError as err:
        raise ValueError(f"the network does not accept inputs of shape {shape} from featuresCol "
                         f"{features_col!r} (set inputShape?): {err}") from None
    if spec.loss == "cross_entropy":
        classes = out.shape[1] if out.dim() == 2 else None
        if classes is None or max_label >= classes:
            raise ValueError(f"the network outputs {tuple(out.shape[1:])} values per row but labelCol "
                             f"{label_col!r} has class indices up to {int(max_label)}; it needs at least "
                             f"{int(max_label) + 1} outputs")


def check_training_data(frame: DataFrame, module: torch.nn.Module, spec: TrainSpec, features_col: str,
                        label_col: str, num_workers: int) -> int:
    """All the checks; return the feature length."""
    profile = data_profile(frame)
    n_features = check_profile(profile, spec, features_col, label_col, num_workers)
    check_network(module, spec, n_features, profile["max_label"], features_col, label_col)
    return n_features
