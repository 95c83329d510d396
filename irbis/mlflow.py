"""MLflow support (``pip install 'irbis[mlflow]'``): fitted pipelines as MLflow models, fits as MLflow runs.

:func:`log_model` logs a fitted ``PipelineModel`` (or one Irbis stage) as an MLflow model with three faces:

* the Spark model itself, saved by Spark's writer into the model's ``sparkml`` folder (network files are the
  stages' own sidecar files, never pickled): :func:`load_model` gives it back, as does
  ``PipelineModel.load`` on that folder (and ``mlflow.spark.load_model`` for a pipeline);
* a ``python_function`` flavor whose ``predict`` runs the stages' kernels without a JVM, through the scorer
  ``irbis serve`` runs (:func:`irbis.serving.predictor.compile_stages` over
  :func:`irbis.ml.kernel_pipeline.load_local`), so ``mlflow.pyfunc.load_model`` and
  ``mlflow models serve --env-manager local`` answer without Spark. A pipeline with a stage that has no
  kernel still logs, with a warning: its pyfunc runs through a local Spark session;
* a signature and an input example, from ``input_example`` (a pandas or Spark DataFrame, or rows).

:func:`log_training` logs a fitted ``TorchEstimator``'s Params, its per-epoch training summary as metrics
(loss, validation loss and accuracy, samples per second, staleness and parameter-server counters) and a
loss-curve PNG. ``TorchEstimator.fit`` calls it on the driver inside an active MLflow run, or with
``mlflowRun=True``.

Examples
--------
>>> import irbis.mlflow                                                         # doctest: +SKIP
>>> info = irbis.mlflow.log_model(model, "model", input_example=test_df)       # doctest: +SKIP
>>> mlflow.pyfunc.load_model(info.model_uri).predict(pandas_rows)               # doctest: +SKIP
>>> irbis.mlflow.load_model(info.model_uri).transform(test_df)                  # doctest: +SKIP
"""
from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

try:
    import mlflow  # noqa: F401  (imported only to fail early, with the extra to install, where it is missing)
except ImportError as _err:  # pragma: no cover - the message is the point
    raise ImportError("irbis.mlflow needs MLflow: pip install 'irbis[mlflow]'") from _err

from irbis.errors import NoKernelError
from irbis.ml.tracking import log_training

__all__ = ["FLAVOR_NAME", "IrbisPyfunc", "load_model", "log_model", "log_training", "save_model"]

FLAVOR_NAME = "irbis"
#: The folder of the saved Spark model inside an MLflow model (the name mlflow.spark gives it too).
MODEL_DATA = "sparkml"
#: Rows of a Spark DataFrame ``input_example`` that the example keeps.
EXAMPLE_ROWS = 5

_log = logging.getLogger(__name__)


# -- logging and loading a model ------------------------------------------------------------------------
def _is_pipeline(model: Any) -> bool:
    from pyspark.ml import PipelineModel

    return isinstance(model, PipelineModel)


def _check_model(model: Any) -> None:
    from irbis.ml.persistence import IrbisPersistable

    if not (_is_pipeline(model) or isinstance(model, IrbisPersistable)):
        raise TypeError(f"irbis.mlflow.log_model takes a fitted PipelineModel or an Irbis stage, found "
                        f"{type(model).__name__}; wrap a SparkML stage in PipelineModel([stage])")


def _input_columns(model: Any) -> dict[str, frozenset[str]]:
    """The columns a live model reads from its input, with the kinds of value each accepts."""
    from irbis.ml.kernel_pipeline import model_chain

    return model_chain(model).inputs


def _image_fields(value: Any) -> Mapping[str, Any] | None:
    """The fields of a Spark image struct (a Row or a dict with Spark's image fields), else ``None``."""
    from irbis.kernels.image.decode import IMAGE_FIELDS

    fields = value.asDict() if hasattr(value, "asDict") else value if isinstance(value, Mapping) else None
    return fields if fields is not None and set(IMAGE_FIELDS) <= set(fields) else None


def _png(fields: Mapping[str, Any]) -> bytes:
    """A Spark image struct as PNG bytes (lossless: the pixels decode back unchanged)."""
    from irbis.extras import load
    from irbis.kernels.image.decode import struct_to_array

    cv2 = load("cv2", "images")
    pixels = struct_to_array(fields)
    ok, encoded = False, None
    if pixels.dtype in (np.uint8, np.uint16) and pixels.shape[2] in (1, 3, 4):
        ok, encoded = cv2.imencode(".png", pixels)
    if not ok or encoded is None:
        raise ValueError(f"image {fields.get('origin')!r}: {pixels.dtype} pixels with {pixels.shape[2]} channels "
                         "have no PNG form; pass the image file's bytes instead")
    return encoded.tobytes()


def _plain(value: Any) -> Any:
    """A value of a Spark row or a pandas cell as JSON takes it (vectors as lists, bytes kept, a Spark image
    struct, as ``read_images`` gives it, as PNG bytes)."""
    if hasattr(value, "toArray"):
        return value.toArray().tolist()
    fields = _image_fields(value)
    if fields is not None:
        return _png(fields)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def _example_frame(example: Any, columns: Sequence[str]) -> pd.DataFrame:
    """``input_example`` as a pandas DataFrame of the model's input columns (a Spark DataFrame: its first
    :data:`EXAMPLE_ROWS` rows), vectors as lists of numbers."""
    if hasattr(example, "sparkSession") and hasattr(example, "limit"):
        missing = [c for c in columns if c not in example.columns]
        if missing:
            raise ValueError(f"input_example lacks the columns {missing} that the model reads ({list(columns)})")
        rows = example.select(*columns).limit(EXAMPLE_ROWS).collect()
        return pd.DataFrame({c: [_plain(r[c]) for r in rows] for c in columns})
    if isinstance(example, Mapping):
        example = [example]
    frame = example if isinstance(example, pd.DataFrame) else pd.DataFrame(list(example))
    keep = [c for c in columns if c in frame.columns] or list(frame.columns)
    return pd.DataFrame({c: [_plain(v) for v in frame[c]] for c in keep})


def save_model(irbis_model: Any, path: str, mlflow_model: Any = None, *, input_example: Any = None,
               signature: Any = None, outputs: Sequence[str] | None = None,
               pip_requirements: Sequence[str] | None = None, extra_pip_requirements: Sequence[str] | None = None,
               metadata: dict[str, Any] | None = None) -> None:
    """Save ``irbis_model`` (a fitted ``PipelineModel`` or Irbis stage) as an MLflow model in the new local
    folder ``path`` (see :func:`log_model`)."""
    import pyspark
    from mlflow import pyfunc
    from mlflow.models import Model
    from mlflow.models.model import MLMODEL_FILE_NAME
    from mlflow.models.utils import _save_example
    from mlflow.utils.environment import (
        _CONDA_ENV_FILE_NAME,
        _PYTHON_ENV_FILE_NAME,
        _REQUIREMENTS_FILE_NAME,
        _process_pip_requirements,
        _PythonEnv,
    )
    from mlflow.utils.requirements_utils import _get_pinned_requirement

    model = irbis_model
    _check_model(model)
    path = os.path.abspath(path)
    if os.path.exists(path) and os.listdir(path):
        raise FileExistsError(f"{path!r} already holds files; save the model into a new folder")
    os.makedirs(path, exist_ok=True)
    data = os.path.join(path, MODEL_DATA)
    model.write().save(data)  # a new folder: no overwrite, whose check needs a classic session
    config = {"outputs": list(outputs) if outputs else None}
    try:  # the pyfunc as it will load (unknown outputs are refused here)
        pyfunc_model, missing = _load_kernels(data, config), []
    except NoKernelError as err:
        pyfunc_model, missing = None, list(err.classes)
    if missing:
        warnings.warn(f"irbis.mlflow: {', '.join(dict.fromkeys(missing))} has no kernel; the model logs for Spark, "
                      "but its pyfunc will need a Spark session (it starts a local one to score)", UserWarning,
                      stacklevel=2)
    mlflow_model = mlflow_model if mlflow_model is not None else Model()
    if input_example is not None:
        example = _example_frame(input_example, list(_input_columns(model)))
        _save_example(mlflow_model, example, path)
        if signature is None:
            from mlflow.models import infer_signature

            scored = pyfunc_model.predict(example) if pyfunc_model is not None else None
            signature = infer_signature(example, scored)
    if signature is None:
        signature = _kernel_signature(model)
    if signature is not None:
        mlflow_model.signature = signature
    if metadata:
        mlflow_model.metadata = metadata
    pyfunc.add_to_model(mlflow_model, loader_module="irbis.mlflow", data=MODEL_DATA, model_config=config,
                        conda_env=_CONDA_ENV_FILE_NAME, python_env=_PYTHON_ENV_FILE_NAME)
    mlflow_model.add_flavor(FLAVOR_NAME, model_data=MODEL_DATA, model_class=_class_name(model),
                            pyspark_version=pyspark.__version__, kernels=not missing)
    if _is_pipeline(model):  # mlflow.spark.load_model reads the same folder
        mlflow_model.add_flavor("spark", pyspark_version=pyspark.__version__, model_data=MODEL_DATA,
                                model_class=_class_name(model))
    mlflow_model.save(os.path.join(path, MLMODEL_FILE_NAME))
    defaults = None if pip_requirements is not None else [_get_pinned_requirement("irbis"),
                                                           _get_pinned_requirement("pyspark")]
    conda_env, requirements, _ = _process_pip_requirements(defaults, pip_requirements, extra_pip_requirements)
    import yaml

    with open(os.path.join(path, _CONDA_ENV_FILE_NAME), "w") as f:
        yaml.safe_dump(conda_env, stream=f, default_flow_style=False)
    with open(os.path.join(path, _REQUIREMENTS_FILE_NAME), "w") as f:
        f.write("\n".join(requirements))
    _PythonEnv.current().to_yaml(os.path.join(path, _PYTHON_ENV_FILE_NAME))


def _class_name(model: Any) -> str:
    return f"{type(model).__module__}.{type(model).__name__}"


def _mlflow_type(kinds: frozenset[str] | set[str]) -> Any:
    from mlflow.types import DataType
    from mlflow.types.schema import Array

    if "vector" in kinds and "number" not in kinds:
        return Array(DataType.double)
    if "number" in kinds:
        return DataType.double
    if "image" in kinds:
        return DataType.binary
    return DataType.string


def _spark_type(dtype: Any) -> Any:
    from mlflow.types import DataType
    from mlflow.types.schema import Array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, NumericType, StringType

    if isinstance(dtype, (VectorUDT, ArrayType)):
        return Array(DataType.double)
    if isinstance(dtype, NumericType):
        return DataType.double
    if isinstance(dtype, StringType):
        return DataType.string
    return None


def _kernel_signature(model: Any) -> Any:
    """The signature without an example: the input columns' types from the kinds they accept; the last
    stage's outputs from their Spark types (left out where a type has no MLflow column type)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    from irbis.ml.kernel_pipeline import model_chain

    chain = model_chain(model)
    inputs = Schema([ColSpec(_mlflow_type(k), c) for c, k in chain.inputs.items()])
    last = chain.steps[-1]
    if last in chain.missing:
        return ModelSignature(inputs)
    specs = [(c, _spark_type(last.types.get(c))) for c in last.outputs]
    if any(t is None for _, t in specs):
        return ModelSignature(inputs)
    return ModelSignature(inputs, Schema([ColSpec(t, c) for c, t in specs]))


def log_model(model: Any, artifact_path: str = "model", *, input_example: Any = None, signature: Any = None,
              outputs: Sequence[str] | None = None, registered_model_name: str | None = None,
              pip_requirements: Sequence[str] | None = None, extra_pip_requirements: Sequence[str] | None = None,
              metadata: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Log a fitted ``PipelineModel`` or Irbis stage to the active MLflow run (a new one if none is active).

    Parameters
    ----------
    model : PipelineModel or Irbis stage
        Saved through Spark's writer (a Spark session must be active) into the model's ``sparkml`` folder.
    artifact_path : str
        The model's name in the run.
    input_example : pandas DataFrame, Spark DataFrame, dict or list of dicts, optional
        Rows of the model's input columns (of a Spark DataFrame, its first :data:`EXAMPLE_ROWS` rows), saved
        as the input example; the signature is inferred from them and the pyfunc's answer to them. Images
        (Spark image structs, as ``read_images`` gives them) are kept as PNG files' bytes, the form the pyfunc
        and ``mlflow models serve`` take them in.
    signature : mlflow.models.ModelSignature, optional
        Without one and without an example, the input and output columns' types come from the stages'
        kernels.
    outputs : list of str, optional
        The columns the pyfunc answers with: by default the last stage's output columns (a classifier's
        ``rawPrediction``, ``probability`` and ``prediction``), ``["all"]`` for every column the pipeline
        writes; ``mlflow.pyfunc.load_model(uri, model_config={"outputs": [...]})`` chooses again.
    registered_model_name, pip_requirements, extra_pip_requirements, metadata, kwargs
        As ``mlflow.pyfunc.log_model`` takes them. The default requirements pin the installed Irbis and
        PySpark.

    Returns
    -------
    mlflow.models.model.ModelInfo
        ``model_uri`` loads it with :func:`load_model` or ``mlflow.pyfunc.load_model``.
    """
    from mlflow.models import Model

    _check_model(model)
    return Model.log(artifact_path=None, name=artifact_path, flavor=sys.modules[__name__],
                     irbis_model=model, input_example=input_example, signature=signature, outputs=outputs,
                     registered_model_name=registered_model_name, pip_requirements=pip_requirements,
                     extra_pip_requirements=extra_pip_requirements, metadata=metadata, **kwargs)


def load_model(model_uri: str, dst_path: str | None = None) -> Any:
    """The Spark model logged at ``model_uri`` (a ``PipelineModel``, or the one stage logged), read by Spark's
    reader from the model's ``sparkml`` folder; needs a Spark session."""
    from mlflow.models import Model
    from mlflow.tracking.artifact_utils import _download_artifact_from_uri
    from pyspark.ml.util import DefaultParamsReader
    from pyspark.sql import SparkSession

    local = _download_artifact_from_uri(artifact_uri=model_uri, output_path=dst_path)
    conf = Model.load(local).flavors[FLAVOR_NAME]
    folder = os.path.join(local, conf["model_data"])
    if conf["model_class"].endswith(".PipelineModel"):
        from pyspark.ml import PipelineModel

        return PipelineModel.load(folder)
    return DefaultParamsReader.loadParamsInstance(folder, SparkSession.active())


# -- the pyfunc flavor ------------------------------------------------------------------------------------
class IrbisPyfunc:
    """The pyfunc of a logged model: rows in (a pandas DataFrame, a dict or a list of dicts keyed by the input
    columns; vectors as lists or arrays, images as an image file's bytes or base64 text, or as Spark image
    structs), a pandas DataFrame of the output columns out, computed by the serving predictor
    (:mod:`irbis.serving.predictor`)."""

    def __init__(self, predictor: Any) -> None:
        self.predictor = predictor

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """The output columns for the rows of ``model_input``; each value is checked as ``irbis serve`` checks a
        request's (:func:`irbis.serving.codecs.decode_value`), a bad one raising ``ValueError`` naming its
        column and row."""
        from irbis.serving.codecs import check_shapes, decode_value

        inputs, nullable = self.predictor.inputs, self.predictor.nullable
        frame = model_input if isinstance(model_input, pd.DataFrame) else _example_frame(model_input, list(inputs))
        missing = [c for c in inputs if c not in frame.columns]
        if missing:
            raise ValueError(f"missing columns {missing}; the model reads {list(inputs)}")
        columns = {c: [decode_value(_json_ready(v), c, kinds, nullable[c], f" (row {i})")
                       for i, v in enumerate(frame[c].tolist())] for c, kinds in inputs.items()}
        check_shapes(columns, inputs)
        out = self.predictor.predict(columns)
        return pd.DataFrame({c: _column(out[c]) for c in self.predictor.outputs}, copy=False)

    def get_raw_model(self) -> Any:
        """The serving predictor underneath."""
        return self.predictor


def _column(values: list[Any]) -> np.ndarray:
    """Output values as one column: numbers as float64 (None as NaN), anything else (lists) as objects."""
    if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
        return np.array([np.nan if v is None else v for v in values], np.float64)
    column = np.empty(len(values), object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def _json_ready(value: Any) -> Any:
    """A cell as a JSON request would carry it (bytes as base64 text, NaN as null)."""
    import base64

    value = _plain(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _load_kernels(data_path: str, model_config: dict[str, Any] | None) -> IrbisPyfunc:
    """The pyfunc of the kernels of the model saved in ``data_path``; :class:`NoKernelError` naming the stages
    without one."""
    from irbis.serving.predictor import compile_stages

    return IrbisPyfunc(compile_stages(data_path, (model_config or {}).get("outputs") or None))


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> IrbisPyfunc:
    """MLflow's entry point for the pyfunc flavor: the kernels of the model saved in ``data_path``, or, for a
    model with a stage that has no kernel, the model run through a local Spark session."""
    from irbis.serving.predictor import load_predictor

    outputs = (model_config or {}).get("outputs") or None
    try:
        return _load_kernels(data_path, model_config)
    except NoKernelError as err:
        _log.warning("irbis.mlflow: %s; scoring through a local Spark session (slower)", err)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()  # the caller's session, else a local one
    master = active.conf.get("spark.master", None) if active is not None else None
    return IrbisPyfunc(load_predictor(data_path, outputs, spark=master or "local[*]"))
