"""Driver-side checks of the training data, run before any worker starts.

Each worker profiles its partition as it reads it (rows, nulls, feature
lengths, label range); the workers all-gather the profiles and run the same
checks, plus a forward pass of the network on a zero batch, before the first
step. On a problem every worker returns the error instead of raising (a
raised error would make Spark retry the stage for nothing); it crosses to the
driver as a structured record (:mod:`irbis.errors`: type, message, and the
column, expected and found values) and the driver raises the same exception
class with the same message: bad input costs no extra Spark job, and nothing
trains.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from irbis.errors import with_fields
from irbis.train.loop import TrainSpec
from irbis.train.optim import loss_entry
from irbis.train.worker_data import finite_rows

PROFILE_KEYS = ("rows", "null_labels", "null_features", "min_len", "max_len", "min_label", "max_label",
                "fractional_labels", "nonfinite_rows", "bad_images", "first_bad_image", "min_label_width",
                "max_label_width", "min_label_sum", "max_label_sum")


def shard_profile(x_lengths: np.ndarray, labels: np.ndarray, null_features: int,
                  nonfinite_rows: int = 0, bad_images: int = 0, first_bad_image: int = -1,
                  label_widths: np.ndarray | None = None) -> np.ndarray:
    """One worker's profile (see :data:`PROFILE_KEYS`) as a float64 vector for an all-gather.

    ``labels``: ``(n,)`` numbers or ``(n, k)`` vectors; ``label_widths``: each vector label's width (None: the
    labels are numbers, width 0). ``nonfinite_rows`` counts the rows whose features or label are NaN or
    infinite, ``bad_images`` the images that could not be read, the first of them row ``first_bad_image`` of
    the partition (-1: none).
    """
    finite = finite_rows(labels)
    ok = labels[finite].ravel()
    widths = np.zeros(len(labels)) if label_widths is None else label_widths[label_widths > 0]
    sums = labels[finite].sum(axis=1) if labels.ndim == 2 else np.zeros(0)  # a distribution's: 1
    lens = x_lengths if len(x_lengths) else np.array([np.inf])
    return np.array([len(labels), len(labels) - int(finite.sum()), null_features, lens.min(),
                     x_lengths.max() if len(x_lengths) else -np.inf,
                     ok.min() if len(ok) else np.inf, ok.max() if len(ok) else -np.inf,
                     int((ok != np.floor(ok)).sum()), nonfinite_rows, bad_images, first_bad_image,
                     widths.min() if len(widths) else np.inf, widths.max() if len(widths) else -np.inf,
                     sums.min() if len(sums) else np.inf, sums.max() if len(sums) else -np.inf],
                    dtype=np.float64)


def merge_profiles(profiles: list[np.ndarray]) -> dict[str, Any]:
    """Combine the workers' profiles into one dict for :func:`check_profile`."""
    p = np.stack(profiles)
    firsts = [(w, int(row)) for w, row in enumerate(p[:, 10]) if row >= 0]
    merged = {"rows": p[:, 0].sum(), "null_labels": p[:, 1].sum(), "null_features": p[:, 2].sum(),
              "min_len": p[:, 3].min(), "max_len": p[:, 4].max(), "min_label": p[:, 5].min(),
              "max_label": p[:, 6].max(), "fractional_labels": p[:, 7].sum(), "min_rows": p[:, 0].min(),
              "nonfinite_rows": p[:, 8].sum(), "min_finite_rows": (p[:, 0] - p[:, 8] - p[:, 9]).min(),
              "bad_images": p[:, 9].sum(), "first_bad_worker": firsts[0][0] if firsts else -1,
              "first_bad_row": firsts[0][1] if firsts else -1, "min_label_width": p[:, 11].min(),
              "max_label_width": p[:, 12].max(), "min_label_sum": p[:, 13].min(), "max_label_sum": p[:, 14].max()}
    return {k: (int(v) if np.isfinite(v) and float(v).is_integer() else float(v)) for k, v in merged.items()}


def check_profile(p: dict[str, Any], spec: TrainSpec, features_col: str, label_col: str, num_workers: int) -> int:
    """Raise a ValueError naming the column for bad data; return the feature length."""
    if p["min_rows"] == 0:
        raise with_fields(ValueError(f"a training task received no rows ({p['rows']} rows for "
                                     f"numWorkers={num_workers}); use fewer workers or more data"),
                          expected="rows on every task", found=p["rows"])
    if spec.data.nanPolicy == "skip" and p["min_finite_rows"] == 0:
        raise with_fields(ValueError(f"a training task has no rows left after nanPolicy='skip' dropped the "
                                     f"{p['nonfinite_rows']} rows with NaN or infinite values of {features_col!r} "
                                     f"or {label_col!r}; use fewer workers or clean the data"),
                          column=features_col, expected="finite rows on every task", found=p["nonfinite_rows"])
    if p.get("bad_images") and spec.data.nanPolicy == "error":
        raise with_fields(ValueError(f"{p['bad_images']} images of inputCol {features_col!r} cannot be read "
                                     f"(the first: row {p['first_bad_row']} of training task "
                                     f"{p['first_bad_worker']}'s partition); drop them, or set nanPolicy='skip' "
                                     "to train without them"),
                          column=features_col, expected="readable images", found=p["bad_images"])
    check_label_kind(p, spec.optim.loss, label_col)
    if p["null_labels"] and spec.data.nanPolicy != "skip":
        raise with_fields(ValueError(f"labelCol {label_col!r} has {p['null_labels']} null/NaN values; "
                                     "drop or impute them before fitting"), column=label_col,
                          expected="no nulls", found=p["null_labels"])
    sequences = spec.data.input_format is not None and spec.data.input_format.sequences
    if p["null_features"] and sequences:
        if spec.data.nanPolicy != "skip":
            raise with_fields(ValueError(f"inputCol {features_col!r} has {p['null_features']} null or empty "
                                         "sequences (or sequences holding a null or non-finite value); drop them, or "
                                         "set nanPolicy='skip' to train without them"),
                              column=features_col, expected="no null or empty sequences", found=p["null_features"])
    elif p["null_features"]:
        raise with_fields(ValueError(f"inputCol {features_col!r} has {p['null_features']} null rows; "
                                     "drop them first"), column=features_col, expected="no nulls",
                          found=p["null_features"])
    if p["nonfinite_rows"] and spec.data.nanPolicy == "error":
        raise with_fields(ValueError(f"{p['nonfinite_rows']} rows of inputCol {features_col!r} or labelCol "
                                     f"{label_col!r} hold NaN or infinite values, which would make the loss NaN; "
                                     "drop or impute them, or set nanPolicy='skip' to train without them"),
                          column=features_col, expected="finite values", found=p["nonfinite_rows"])
    images = spec.data.input_format is not None and spec.data.input_format.images
    if p["min_len"] != p["max_len"] and images:
        raise with_fields(ValueError(f"inputCol {features_col!r} holds images of different sizes (from "
                                     f"{p['min_len']} to {p['max_len']} values) and no preprocessing resizes "
                                     "them; set imagePreprocessing (a catalogue model, or its JSON record)"),
                          column=features_col, expected="one image size", found=[p["min_len"], p["max_len"]])
    if p["min_len"] != p["max_len"] and not sequences:
        raise with_fields(ValueError(f"inputCol {features_col!r} rows must all have the same length, found "
                                     f"lengths from {p['min_len']} to {p['max_len']}"), column=features_col,
                          expected="one length", found=[p["min_len"], p["max_len"]])
    if spec.optim.loss == "cross_entropy" and (p["fractional_labels"] or p["min_label"] < 0):
        raise with_fields(ValueError(f"labelCol {label_col!r} must hold class indices 0..K-1 for "
                                     f"loss='cross_entropy', found values from {p['min_label']} to "
                                     f"{p['max_label']}" + (" with fractions" if p["fractional_labels"] else "")),
                          column=label_col, expected="class indices 0..K-1", found=[p["min_label"], p["max_label"]])
    return int(p["max_len"])


def check_label_kind(p: dict[str, Any], loss: Any, label_col: str) -> None:
    """Raise naming ``label_col`` where its labels are not what ``loss`` (a :data:`~irbis.train.optim.LOSSES`
    name) takes: numbers or vectors of one width, class indices, 0/1 values, distributions."""
    width = p.get("max_label_width", 0)
    width = int(width) if np.isfinite(width) else 0
    if width and p["min_label_width"] != width:
        raise with_fields(ValueError(f"labelCol {label_col!r} holds vectors of different widths (from "
                                     f"{p['min_label_width']} to {width}); give every row one label per output"),
                          column=label_col, expected="one width", found=[p["min_label_width"], width])
    entry = loss_entry(loss)
    if entry is None:
        return
    if width and entry.labels == "index":
        raise with_fields(ValueError(f"labelCol {label_col!r} holds vectors of {width} values, but loss={loss!r} "
                                     "takes a class index per row; use loss='soft_cross_entropy' for label "
                                     "distributions, 'bce' for multi-label 0/1 vectors, 'mse' for vector targets "
                                     "(irbis.vote_labels turns annotators' votes into any of these)"),
                          column=label_col, expected="a class index per row", found=f"vectors of {width}")
    if not width and entry.labels == "vector":
        raise with_fields(ValueError(f"labelCol {label_col!r} holds numbers, but loss={loss!r} takes a vector "
                                     "per row (a distribution over the network's outputs); use 'cross_entropy' for "
                                     "a class index per row"), column=label_col, expected="a vector per row",
                          found="numbers")
    low, high = p["min_label"], p["max_label"]
    if loss == "bce" and (low < 0 or high > 1):
        raise with_fields(ValueError(f"labelCol {label_col!r} holds values from {low:g} to {high:g}; loss='bce' "
                                     "takes 0/1 (or probabilities in [0, 1]) per class"), column=label_col,
                          expected="values in [0, 1]", found=[low, high])
    if loss == "soft_cross_entropy" and low < 0:
        raise with_fields(ValueError(f"labelCol {label_col!r} holds values down to {low:g}; "
                                     "loss='soft_cross_entropy' takes a distribution (values >= 0 summing to 1) "
                                     "per row"), column=label_col, expected="values >= 0", found=low)
    sums = (p.get("min_label_sum", 1.0), p.get("max_label_sum", 1.0))
    if loss == "soft_cross_entropy" and np.isfinite(sums).all() and max(abs(s - 1) for s in sums) > 1e-3:
        raise with_fields(ValueError(f"labelCol {label_col!r} holds rows summing to {sums[0]:g}..{sums[1]:g}; "
                                     "loss='soft_cross_entropy' takes a distribution per row (summing to 1): "
                                     "divide each row by its sum (irbis.vote_labels(votes, 'soft') does)"),
                          column=label_col, expected="rows summing to 1", found=list(sums))


def check_network(module: torch.nn.Module, spec: TrainSpec, n_features: int, max_label: float,
                  features_col: str, label_col: str, min_label: float = 0.0, label_width: int = 0) -> None:
    """Run the network on a zero batch (sequences: a batch of token ids as its input_kind takes them): input
    shape, and output width against the labels (``label_width``: the vector labels' width; 0: numbers)."""
    if spec.data.input_format is not None and spec.data.input_format.sequences:
        out = _sequence_output(module, features_col, spec.data.input_format.shape)
    else:
        out = _zero_output(module, spec, n_features, features_col)
    _check_output(out, spec, max_label, label_col, min_label)
    if label_width:
        width = int(np.prod(out.shape[1:])) if out.dim() >= 2 else 1
        if out.dim() != 2 or width != label_width:
            raise with_fields(ValueError(f"labelCol {label_col!r} holds vectors of {label_width} values but the "
                                         f"network outputs {tuple(out.shape[1:])} per row; it must output "
                                         f"{label_width} values (one per label), or give labels of its width"),
                              column=label_col, expected=label_width, found=list(out.shape[1:]))


def _sequence_output(module: torch.nn.Module, features_col: str, steps: list[int] | None = None) -> torch.Tensor:
    """The network's output for two rows of token ids, or of steps of ``steps[0]`` features."""
    from irbis.kernels.sequences import input_kind
    from irbis.train.ragged import check_network, make_batch

    kind = input_kind(module)
    rows = [np.ones((n, *steps), np.float32) if steps else np.ones(n, np.int64) for n in (5, 3)]
    xb, _ = make_batch(rows, kind)
    was_training = module.training
    try:
        return check_network(module.eval(), xb, kind, 2)
    except ValueError as err:
        held = f"steps of {steps[0]} features" if steps else "token ids"
        raise with_fields(ValueError(f"inputCol {features_col!r} holds {held}: {err}"), column=features_col,
                          expected=f"a network taking input_kind {kind!r}", found="variable-length rows") from None
    finally:
        module.train(was_training)


def _zero_output(module: torch.nn.Module, spec: TrainSpec, n_features: int, features_col: str) -> torch.Tensor:
    shape = list(spec.data.inputShape or [n_features])
    if int(torch.tensor(shape).prod()) != n_features:
        raise with_fields(ValueError(f"inputShape {shape} holds {int(torch.tensor(shape).prod())} values but "
                                     f"inputCol {features_col!r} has {n_features}"), column=features_col,
                          expected=shape, found=n_features)
    try:
        with torch.no_grad():
            was_training = module.training
            out = module.eval()(torch.zeros(2, *shape))
            module.train(was_training)
    except RuntimeError as err:
        raise with_fields(ValueError(f"the network does not accept inputs of shape {shape} from inputCol "
                                     f"{features_col!r} (set inputShape?): {err}"), column=features_col,
                          expected="an input the network accepts", found=shape) from None
    return out


def _check_output(out: torch.Tensor, spec: TrainSpec, max_label: float, label_col: str, min_label: float) -> None:
    if spec.optim.loss == "cross_entropy":
        classes = out.shape[1] if out.dim() == 2 else None
        weights = spec.optim.classWeights
        if isinstance(weights, list) and classes is not None and len(weights) != classes:
            raise with_fields(ValueError(f"classWeights has {len(weights)} weights but the network outputs {classes} "
                                         "classes; give one weight per class"), column=label_col,
                              expected=classes, found=len(weights))
        if classes is not None and max_label >= classes and spec.data.classes_param:
            name = spec.data.classes_param
            raise with_fields(ValueError(f"labelCol {label_col!r} holds labels from {min_label:g} to {max_label:g}, "
                                         f"outside [0, {name}={classes}); index the labels 0..{classes - 1} "
                                         f"(StringIndexer) or set {name}"), column=label_col,
                              expected=f"0..{classes - 1}", found=[min_label, max_label])
        if classes is None or max_label >= classes:
            raise with_fields(ValueError(f"the network outputs {tuple(out.shape[1:])} values per row but "
                                         f"labelCol {label_col!r} has class indices up to {int(max_label)}; it "
                                         f"needs at least {int(max_label) + 1} outputs"), column=label_col,
                              expected=int(max_label) + 1, found=list(out.shape[1:]))


def validation_error(profile: dict[str, Any], module: torch.nn.Module, spec: TrainSpec, features_col: str,
                     label_col: str, num_workers: int) -> Exception | None:
    """Every check on the merged profile and the network; the error (with its fields), or None."""
    try:
        n_features = check_profile(profile, spec, features_col, label_col, num_workers)
        width = profile.get("max_label_width", 0)
        check_network(module, spec, n_features, profile["max_label"], features_col, label_col,
                      profile["min_label"], int(width) if np.isfinite(width) else 0)
    except (ValueError, TypeError) as err:
        return err
    return None
