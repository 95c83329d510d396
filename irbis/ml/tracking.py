"""Logging a fit to MLflow from the driver: the estimators' ``mlflowRun``.

MLflow is imported only when a fit logs (an MLflow run is active, or ``mlflowRun=True``), so Irbis needs it
only then: :func:`fit_is_tracked` says whether a fit logs, :func:`log_fit` logs it.
:mod:`irbis.mlflow` (logging and loading models) re-exports :func:`log_training`.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["fit_is_tracked", "log_fit", "log_training"]

#: MLflow's limit on a Param value's length.
_PARAM_CHARS = 6000


def _metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """An epoch record's numbers as MLflow metrics: nested dicts flattened with dots (``staleness.mean``),
    lists and text left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "epoch":
            continue
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in _metrics(value).items()})
        elif isinstance(value, (int, float, np.number)) and not isinstance(value, bool) \
                and math.isfinite(float(value)):
            out[key] = float(value)
    return out


def _params(estimator: Any) -> dict[str, str]:
    """The estimator's Params (set and default) as MLflow Params."""
    values = {p.name: v for p, v in estimator.extractParamMap().items()}
    return {name: str(value)[:_PARAM_CHARS] for name, value in sorted(values.items())}


def log_training(estimator: Any, summary: Sequence[Mapping[str, Any]], start_run: bool = False) -> str | None:
    """Log a fit to MLflow: the estimator's Params, each epoch record of ``summary`` as metrics at step
    ``epoch`` and a loss-curve PNG (``loss_curve.png``). Logs into the active run; if that run already holds
    another fit's Params, into a run nested in it; with no active run, into a new run if ``start_run``, else
    nothing. Returns the run's id (None when nothing was logged)."""
    import mlflow
    from mlflow.entities import Metric

    from irbis.train.progress import plot_loss_curves

    active = mlflow.active_run()
    if active is None and not start_run:
        return None
    params = _params(estimator)
    nested = active is not None and any(
        params.get(k, v) != v for k, v in mlflow.get_run(active.info.run_id).data.params.items())
    owned = active is None or nested
    run = mlflow.start_run(nested=nested, run_name=f"{type(estimator).__name__} {estimator.uid}") if owned \
        else active
    assert run is not None  # started here unless one was active
    try:
        run_id = run.info.run_id
        client = mlflow.MlflowClient()
        mlflow.log_params(params)
        mlflow.set_tag("irbis.estimator", f"{type(estimator).__name__} {estimator.uid}")
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, int(record.get("epoch", i + 1)))
                   for i, record in enumerate(summary) for key, value in _metrics(record).items()]
        for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
            client.log_batch(run_id, metrics=metrics[start:start + 1000])
        curves = {"training": [{"epoch": r["epoch"], "loss": r.get("loss")} for r in summary]}
        if any(r.get("validationLoss") is not None for r in summary):
            curves["validation"] = [{"epoch": r["epoch"], "loss": r.get("validationLoss")} for r in summary]
        folder = tempfile.mkdtemp(prefix="irbis-mlflow-")
        try:
            plot_loss_curves(curves, os.path.join(folder, "loss_curve.png"),
                             title=f"{type(estimator).__name__}: loss per epoch")
            mlflow.log_artifact(os.path.join(folder, "loss_curve.png"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return run_id
    finally:
        if owned:
            mlflow.end_run()


def fit_is_tracked(estimator: Any) -> bool:
    """Whether a fit of ``estimator`` logs to MLflow: its ``mlflowRun`` asks it (MLflow must then be
    installed), or an MLflow run is active (which needs the caller to have imported mlflow: Irbis never
    imports it otherwise)."""
    if estimator.getMlflowRun():
        try:
            import mlflow  # noqa: F401
        except ImportError as err:
            raise ImportError(f"{type(estimator).__name__}: mlflowRun=True needs MLflow ({err})") from None
        return True
    loaded = sys.modules.get("mlflow")
    return loaded is not None and getattr(loaded, "active_run", lambda: None)() is not None


def log_fit(estimator: Any, summary: list[dict[str, Any]]) -> None:
    """Log a finished fit of ``estimator`` (:func:`log_training`); a tracking failure warns and keeps the
    model."""
    try:
        log_training(estimator, summary, start_run=estimator.getMlflowRun())
    except Exception as err:  # noqa: BLE001 - the fitted model matters more than its record
        warnings.warn(f"{type(estimator).__name__}: the fit was not logged to MLflow: {type(err).__name__}: {err}",
                      RuntimeWarning, stacklevel=3)
