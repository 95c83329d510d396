"""What the stages that run a network over a column of images share (ImageFeaturizer, ImageClassifierModel).

Decoding (for a bytes column), preprocessing as the record prescribes and the network run happen in the
same Arrow batch of the same Python worker: pixels never go back to the JVM between the steps. The network
runs through the kernel behind :class:`irbis.ml.TorchModel`
(:func:`irbis.kernels.inference.cached_predict_fn`), loaded once per worker, exported once per machine for
the ONNX engines. A stage built on :class:`ImageNetworkStage` says which network (``_source``), how its
images are preprocessed (``_preprocessing``) and which layers go to which columns (``layer_columns``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.ml.param.shared import HasInputCol
from pyspark.sql import DataFrame
from pyspark.sql.types import BinaryType, DataType, StringType, StructType

from irbis.kernels.blocks import BatchFn
from irbis.kernels.image.decode import DEFAULT_MAX_PIXELS
from irbis.kernels.inference import ImageKernel
from irbis.ml.calibration_sample import HasCalibrationSample
from irbis.ml.column_types import is_image_struct
from irbis.ml.export_ahead_of_job import export_ahead_of_job
from irbis.ml.params import (
    HasDevice,
    HasEngine,
    HasErrorCol,
    HasMiniBatchSize,
    HasPrecision,
    KeywordInit,
    Row,
    at_least,
    table_mixin,
)

__all__ = ["ImageNetworkStage", "is_image_column"]

_DECODE_ROWS: list[Row] = [
    ("maxPixels", "pixel limit when decoding bytes (0: none)", TypeConverters.toInt, DEFAULT_MAX_PIXELS,
     at_least(0)),
    ("fastDecode", "decode large JPEG bytes at 1/2, 1/4 or 1/8 scale when still larger than the model's resize "
     "size (faster; pixels differ slightly from a full decode)", TypeConverters.toBoolean, False),
]


def is_image_column(dtype: DataType) -> bool:
    """Whether a column holds images as a network stage reads them: Spark image structs, or encoded image
    files in a binary column."""
    return is_image_struct(dtype) or isinstance(dtype, BinaryType)


_ImageDecodeParams: Any = table_mixin("_ImageDecodeParams", _DECODE_ROWS)


class ImageNetworkStage(KeywordInit, HasInputCol, _ImageDecodeParams, HasMiniBatchSize,
                        HasDevice, HasPrecision, HasCalibrationSample, HasEngine, HasErrorCol):
    """A stage that decodes and preprocesses a column of images and runs a network on them in one pass.

    Its Params: ``inputCol`` (image structs, or encoded files in a binary column), ``miniBatchSize``,
    ``device``, ``precision``, ``engine``, ``calibrationData``, ``errorCol`` (the reason an image gave a
    null output), ``maxPixels`` and ``fastDecode``. A subclass gives ``_source()`` (the network),
    ``_preprocessing()`` (the images' record) and ``layer_columns()`` (the layer of each output column;
    ``""`` is the network's output), and ``_several_layers()`` when one pass reads several layers.
    """

    _vector_dtype = "float32"
    _accepts = frozenset({"image"})

    def setInputCol(self, value: str) -> Any:  # noqa: N802
        """Sets inputCol: image structs (irbis.read_images) or encoded image files (binary)."""
        return self._set(inputCol=value)

    # -- what a subclass says -----------------------------------------------------------------------
    def _source(self) -> dict[str, Any]:
        raise NotImplementedError

    def _preprocessing(self) -> Any:
        raise NotImplementedError

    def layer_columns(self) -> list[tuple[str, str]]:
        """``(layer, column)`` of each output (``""``: the network's output)."""
        raise NotImplementedError

    def _several_layers(self) -> bool:
        """Whether one pass reads several layers (the predictor then answers a dict by layer)."""
        return False

    # -- the stage's hooks --------------------------------------------------------------------------
    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        err = self.getErrorCol()
        return [(col, VectorUDT()) for _, col in self.layer_columns()] + ([(err, StringType())] if err else [])

    def _validate_schema(self, schema: StructType) -> None:
        found = schema[self.getInputCol()].dataType
        if not is_image_column(found):
            raise TypeError(f"{type(self).__name__}: input column {self.getInputCol()!r} must be an image "
                            f"struct or binary (encoded files), found {found.simpleString()}")

    def _transform_spark(self, df: DataFrame) -> DataFrame:
        out = super()._transform_spark(df)
        export_ahead_of_job(df, self._source(), list(self._preprocessing().input_shape), **self._network_options())
        return out

    def _network_options(self) -> dict[str, Any]:
        """How the network is run (the options the workers and the export ahead share): read at the whole
        set of layers, or at the one layer (None: its output)."""
        pairs = self.layer_columns()
        layer = tuple(name for name, _ in pairs) if self._several_layers() else pairs[0][0] or None
        return dict(output_layer=layer, device=self.getDevice(), precision=self.getPrecision(), engine=self.getEngine())

    def _make_batch_fn(self) -> BatchFn:
        return self._kernel()

    def _kernel(self, classes: tuple[str, ...] = ()) -> ImageKernel:
        """The stage's kernel (:class:`irbis.kernels.inference.ImageKernel`), a plain value the Spark runner
        ships; ``classes`` (probability and prediction columns) for a classifier's head."""
        options = dict(self._network_options(), batch_size=self.getMiniBatchSize(),
                       calibration_data=self.getCalibrationData())
        return ImageKernel(self._source(), self.getInputCol(), self._preprocessing(), tuple(self.layer_columns()),
                           options, several=self._several_layers(), error_col=self.getErrorCol(),
                           max_pixels=self.getMaxPixels() or None, fast_decode=self.getFastDecode(), classes=classes)

    def _network_rows(self, block: Any) -> np.ndarray:
        return self._kernel().convert(block)[0]

    # -- persistence: the calibration sample, when there is one -------------------------------------
    def _has_extra(self) -> bool:
        return bool(self.getCalibrationData())

    def _save_extra(self, path: str) -> None:
        self._save_calibration(path)

    def _load_extra(self, path: str) -> None:
        self._load_calibration(path)
