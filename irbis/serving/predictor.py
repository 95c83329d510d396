"""A saved pipeline compiled into a chain of batch kernels: the request path, with no Spark job.

:func:`load_predictor` reads a saved ``PipelineModel`` (or one stage) and gives a :class:`Predictor`:
the same :data:`~irbis.kernels.blocks.BatchFn` kernels that the stages run on Spark (Irbis
block-kernel stages, and the SparkML stages of :data:`~irbis.kernels.sparkml.SPARKML_KERNELS`), run
one after another by :func:`~irbis.kernels.blocks.run_steps`. A stage without a kernel is refused
by name, unless ``spark`` names a master: then the whole pipeline runs through an embedded Spark
session (:class:`SparkPredictor`), a slower path.
"""
from __future__ import annotations

import base64
import logging
from typing import Any, Sequence

import numpy as np

from irbis.kernels.blocks import Images, Tensor, block_to_rows, rows_in, run_steps
from irbis.kernels.sparkml import SPARKML_KERNELS, StageKernel, kernel_from_state
from irbis.kernels.sparkml_state import StageState, read_stage
from irbis.serving.saved import build_irbis_stage, read_saved

__all__ = ["KINDS", "Predictor", "compile_stages", "json_rows", "load_predictor"]

LOG = logging.getLogger("irbis.serving")

#: Kinds of input column a request may carry, as JSON values: a number, a list of numbers, a
#: string, or an image (a base64 string of an encoded file in JSON; raw bytes or multipart).
KINDS = ("number", "vector", "string", "image")
#: Kinds of the columns a SparkML stage reads, by class (others: any of number, vector, string).
_SPARKML_INPUT_KINDS = {"VectorAssembler": {"number", "vector"}, "StringIndexerModel": {"string", "number"},
                        "ImputerModel": {"number"}, "OneHotEncoderModel": {"number"}}


class Predictor:
    """Kernels run in sequence over the columns of a batch of rows.

    Attributes
    ----------
    inputs : dict of str to set of str
        The columns a request must give, each with the kinds of value it accepts (:data:`KINDS`).
    nullable : dict of str to bool
        Whether a column may be null (or NaN); ``False`` where a stage would fail on it.
    outputs : list of str
        The columns a response carries.
    """

    slow = False

    def __init__(self, kernels: list[StageKernel], inputs: dict[str, set[str]],
                 nullable: dict[str, bool], outputs: Sequence[str] | None = None) -> None:
        self.kernels = kernels
        self.inputs, self.nullable = inputs, nullable
        produced = [c for k in kernels for c in k.outputs]
        self.outputs = _check_outputs(produced, outputs)

    def predict(self, columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Run the pipeline on decoded column values (images as ``(H, W, C)`` arrays); JSON-ready rows."""
        blocks = {c: Images.from_arrays(v) if _are_images(v) else rows_in(v, c) for c, v in columns.items()}
        out = run_steps([(k.inputs, k.fn) for k in self.kernels], blocks)
        return {c: json_rows(out[c]) for c in self.outputs}


def _are_images(values: list[Any]) -> bool:
    """Decoded images are integer (H, W, C) arrays; vectors from JSON are float64."""
    return any(isinstance(v, np.ndarray) and v.dtype.kind == "u" for v in values)


def _check_outputs(produced: list[str], outputs: Sequence[str] | None) -> list[str]:
    if not outputs:
        return list(dict.fromkeys(produced))
    unknown = [c for c in outputs if c not in produced]
    if unknown:
        raise ValueError(f"--outputs names {unknown}, which the pipeline does not produce; it writes {produced}")
    return list(outputs)


def json_rows(block: Any) -> list[Any]:
    """A block as JSON values: vectors as lists, NaN as null, images as dicts with base64 data."""
    if isinstance(block, Images):
        return [None if r is None else {**r, "data": base64.b64encode(r["data"]).decode()}
                for r in block_to_rows(block)]
    rows = block_to_rows(block) if isinstance(block, Tensor) or not isinstance(block, np.ndarray) else block
    return [_json_value(v) for v in rows]


def _json_value(value: Any) -> Any:
    if value is None:
        return None
    if hasattr(value, "toArray"):
        value = value.toArray()
    if isinstance(value, np.ndarray):
        return [_json_value(v) for v in value.tolist()] if value.ndim else _json_value(value.item())
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (np.floating, float)):
        return None if value != value else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


# -- compiling the stages -------------------------------------------------------------------------
def _probe_kinds(stage: Any, column: str) -> set[str]:
    """The kinds an Irbis stage accepts for ``column``, asked of its own schema check."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import BinaryType, DoubleType, StringType, StructField, StructType

    from irbis.spark.images import IMAGE_STRUCT

    candidates = {"image": IMAGE_STRUCT, "vector": VectorUDT(), "number": DoubleType(),
                  "string": StringType(), "binary": BinaryType()}
    accepted = set()
    for kind, dtype in candidates.items():
        try:
            stage._validate_schema(StructType([StructField(column, dtype, True)]))
        except (TypeError, ValueError, KeyError):
            continue
        except Exception:  # a check that needs more than one column: accept the kind
            pass
        accepted.add(kind)
    if "binary" in accepted:  # encoded files arrive as images (bytes) too
        accepted.add("image")
    accepted.discard("binary")
    return accepted if accepted and len(accepted) < 4 else {"number", "vector", "string"}


def _irbis_kernel(stage: Any) -> StageKernel | None:
    from irbis.ml.fuse import fusable

    if not fusable(stage):
        return None
    return StageKernel(stage._input_columns(), [n for n, _ in stage._output_columns()], stage._make_batch_fn())


def _kernel(saved: Any) -> tuple[StageKernel | None, Any]:
    if saved.is_irbis:
        stage = build_irbis_stage(saved)
        return _irbis_kernel(stage), stage
    if saved.short_name not in SPARKML_KERNELS:
        return None, None
    state = read_stage(str(saved.path))
    return kernel_from_state(state), state


def _input_kinds(kernel: StageKernel, stage: Any, column: str) -> set[str]:
    if isinstance(stage, StageState):
        if stage.cls in _SPARKML_INPUT_KINDS:
            return set(_SPARKML_INPUT_KINDS[stage.cls])
        return {"vector"} if "featuresCol" in stage.params else {"number", "vector", "string"}
    return _probe_kinds(stage, column)


def _nullable(stage: Any) -> bool:
    """SparkML's VectorAssembler fails on null and NaN unless ``handleInvalid`` says otherwise."""
    return not (isinstance(stage, StageState) and stage.cls == "VectorAssembler"
                and stage.param("handleInvalid", "error") == "error")


def compile_stages(path: str, outputs: Sequence[str] | None = None) -> Predictor:
    """The :class:`Predictor` of the pipeline saved in ``path``; refuse stages without a kernel."""
    built, missing = [], []
    for saved in read_saved(path):
        kernel, stage = _kernel(saved)
        if kernel is None:
            missing.append(f"{saved.short_name} ({saved.metadata['uid']})")
        built.append((kernel, stage))
    if missing:
        raise ValueError(f"these stages have no serving kernel: {', '.join(missing)}; serve the pipeline "
                         f"through an embedded Spark session instead (--spark local[*], slower)")
    inputs: dict[str, set[str]] = {}
    nullable: dict[str, bool] = {}
    produced: set[str] = set()
    for kernel, stage in built:
        for column in kernel.inputs:
            if column not in produced:
                kinds = _input_kinds(kernel, stage, column)
                inputs[column] = inputs[column] & kinds if column in inputs else kinds
                nullable[column] = nullable.get(column, True) and _nullable(stage)
        produced |= set(kernel.outputs)
    return Predictor([k for k, _ in built], inputs, nullable, outputs)


def load_predictor(path: str, outputs: Sequence[str] | None = None, spark: str | None = None) -> Predictor:
    """A predictor for the pipeline saved in ``path`` (see the module docstring)."""
    try:
        return compile_stages(path, outputs)
    except ValueError as err:
        if spark is None or "no serving kernel" not in str(err):
            raise
        LOG.warning("%s; serving through Spark %s: every batch is a Spark job (slower)", err, spark)
    from irbis.serving.spark_predictor import SparkPredictor

    return SparkPredictor(path, spark, outputs)

