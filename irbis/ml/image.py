"""Spark stages for images: decoding, OpenCV transform chains, unrolling and flip augmentation.

The stages are thin adapters over :mod:`irbis.kernels.image.batch`; every stage works on a Spark
DataFrame (through Arrow) and on a pandas DataFrame (for tests and small data), and saves and loads
with its Params, alone or inside a Pipeline.

Examples
--------
>>> tr = (ImageTransformer(inputCol="image", outputCol="x", outputFormat="vector")
...       .resize(256, 256, keepAspectRatio=True).centerCrop(224, 224)
...       .colorFormat("RGB").normalize(127.0, 128.0))
>>> [op["op"] for op in tr.getOps()]
['resize', 'center_crop', 'color_format', 'normalize']
"""
from __future__ import annotations

from typing import Any

import pandas as pd
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    FloatType,
    StringType,
    StructField,
    StructType,
)

from irbis.kernels.blocks import BatchFn
from irbis.kernels.image.batch import (
    AUGMENTATIONS,
    OUTPUT_FORMATS,
    DecodeKernel,
    TransformKernel,
    UnrollKernel,
    augment_images,
)
from irbis.kernels.image.decode import DEFAULT_MAX_PIXELS, IMAGE_FIELDS, array_to_struct
from irbis.kernels.image.op_chain import ImageChain
from irbis.kernels.image.ops import THRESHOLD_TYPES
from irbis.ml.base import IrbisTransformer
from irbis.ml.column_types import is_image_struct
from irbis.ml.params import ColumnSetters, HasErrorCol, at_least, in_range, one_of, table_mixin
from irbis.ml.synapseml import ImageTransformerNames
from irbis.spark.images import IMAGE_STRUCT

__all__ = ["ImageDecoder", "ImageSetAugmenter", "ImageTransformer", "UnrollImage"]

_NULL_IMAGE = dict.fromkeys(IMAGE_FIELDS)
# Stage outputs use all-nullable fields: a null image crosses Arrow as a struct of nulls.
_OUT_IMAGE = StructType([StructField(f.name, f.dataType, True) for f in IMAGE_STRUCT.fields])


def _struct(img: Any, origin: str) -> dict[str, Any]:
    # A pandas UDF cannot emit a null struct; the base turns an all-null struct into null.
    return _NULL_IMAGE if img is None else array_to_struct(img, origin or "")


def _to_ops(value: Any) -> list[dict[str, Any]]:
    """Param converter: a list of op dicts, an ImageChain or its JSON text, validated."""
    if isinstance(value, ImageChain):
        return value.ops
    if isinstance(value, str):
        return ImageChain.from_json(value).ops
    return ImageChain(value).ops


def _check_image_column(stage: Any, schema: StructType, col: str) -> None:
    found = schema[col].dataType
    if not is_image_struct(found):
        raise TypeError(f"{type(stage).__name__}: input column {col!r} must be an image struct "
                        f"{IMAGE_STRUCT.simpleString()}, found {found.simpleString()}; "
                        f"read images with irbis.read_images or decode bytes with ImageDecoder")


class _ImageStage(IrbisTransformer, ColumnSetters):
    """Shared by the image stages: null image structs read back as ``None`` in pandas."""

    _accepts = frozenset({"image"})

    def _transform_pandas(self, pdf: pd.DataFrame) -> pd.DataFrame:
        out = super()._transform_pandas(pdf)
        for name, dtype in self._output_columns():
            if isinstance(dtype, StructType):
                out[name] = [None if isinstance(v, dict) and all(x is None for x in v.values())
                             else v for v in out[name]]
        return out


_DecoderParams: Any = table_mixin("_DecoderParams", [
    ("originCol", "optional column copied into the image's origin field (e.g. the file path)",
     TypeConverters.toString, ""),
    ("maxPixels", "refuse images with more pixels than this (0: no limit)", TypeConverters.toInt, DEFAULT_MAX_PIXELS,
     at_least(0)),
])


class ImageDecoder(_ImageStage, HasErrorCol, _DecoderParams):
    """Decode a column of encoded image bytes (JPEG, PNG, ...) into Spark image structs.

    Bad bytes give a null image and a message in ``errorCol`` (they never fail the job).

    Examples
    --------
    >>> ImageDecoder(inputCol="content", outputCol="image").getMaxPixels()
    100000000
    """

    _extras = ("images",)

    _defaults = {"inputCol": "content", "outputCol": "image", "errorCol": "error"}

    def _input_columns(self) -> list[str]:
        origin = self.getOriginCol()
        return [self.getInputCol()] + ([origin] if origin else [])

    def _output_columns(self) -> list[tuple[str, DataType]]:
        err = self.getErrorCol()
        return [(self.getOutputCol(), _OUT_IMAGE)] + ([(err, StringType())] if err else [])

    def _validate_schema(self, schema: StructType) -> None:
        found = schema[self.getInputCol()].dataType
        if not isinstance(found, BinaryType):
            raise TypeError(f"ImageDecoder: input column {self.getInputCol()!r} must be binary "
                            f"(encoded image bytes), found {found.simpleString()}")

    def _make_batch_fn(self) -> BatchFn:
        return DecodeKernel(self.getInputCol(), self.getOutputCol(), self.getOriginCol(), self.getErrorCol(),
                            self.getMaxPixels() or None)


#: OpenCV's integer threshold codes (SynapseML's threshold types) -> Irbis's names.
_THRESHOLD_CODES = {code: name for name, code in THRESHOLD_TYPES.items()}


_TransformerParams: Any = table_mixin("_TransformerParams", [
    ("ops", "the operations, a JSON list of {'op': name, args...}", _to_ops, []),
    ("outputFormat", f"one of {OUTPUT_FORMATS}", TypeConverters.toString, "image", one_of(*OUTPUT_FORMATS)),
])


class ImageTransformer(ImageTransformerNames, _ImageStage, HasErrorCol, _TransformerParams):
    """Apply a chain of OpenCV operations to an image column in one pass per image.

    The input is an image struct column, or a binary column of encoded files (decoded in the
    same pass, e.g. ``content`` of Spark's ``binaryFile`` source).

    Build the chain with the methods ``resize``, ``crop``, ``centerCrop``, ``flip``, ``blur``,
    ``threshold``, ``colorFormat`` and ``normalize`` (each returns the stage), or pass ``ops``, a
    JSON list of :data:`irbis.kernels.image.op_chain.OPS` steps. ``outputFormat`` is ``"image"`` (an
    image struct), ``"array"`` (array<float>, CHW) or ``"vector"`` (a Spark ML vector, CHW).

    Examples
    --------
    >>> tr = ImageTransformer(outputCol="small").resize(32, 32).flip(1)
    >>> tr.getOps()[1]
    {'op': 'flip', 'flip_code': 1}
    """

    _extras = ("images",)

    _defaults = {"inputCol": "image", "outputCol": "transformed", "errorCol": ""}

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        # outputFormat is always set (a saved ImageTransformer records it), None values are not
        kwargs = {"outputFormat": self.getOutputFormat(), **{k: v for k, v in kwargs.items() if v is not None}}
        return super()._keywords(kwargs)

    def getOps(self) -> list[dict[str, Any]]:
        return list(self.getOrDefault(self.ops))

    def _add(self, op: str, **args: Any) -> "ImageTransformer":
        return self._set(ops=ImageChain(self.getOps()).then(op, **args).ops)

    def resize(self, height: Any, width: Any = None, keepAspectRatio: bool = False,
               interpolation: str = "linear") -> "ImageTransformer":
        """Resize; with ``keepAspectRatio`` the image covers ``height`` x ``width`` (shorter side fits).

        SynapseML's forms work too: ``resize(size)`` or ``resize(size, True)`` fit the shorter side to
        ``size`` keeping the aspect ratio, ``resize(size, False)`` gives ``size`` x ``size`` and
        ``resize((width, height))`` that exact size.
        """
        if width is None or isinstance(width, bool):
            keep = True if width is None else width
            if isinstance(height, tuple):
                height, width, keepAspectRatio = height[1], height[0], False
            else:
                width, keepAspectRatio = height, keep
        return self._add("resize", height=height, width=width, keep_aspect_ratio=keepAspectRatio,
                         interpolation=interpolation)

    def crop(self, x: int, y: int, height: int, width: int) -> "ImageTransformer":
        """Cut the window with top-left corner column ``x``, row ``y``."""
        return self._add("crop", x=x, y=y, height=height, width=width)

    def centerCrop(self, height: int, width: int) -> "ImageTransformer":  # noqa: N802
        """Cut the central ``height`` x ``width`` window."""
        return self._add("center_crop", height=height, width=width)

    def flip(self, flipCode: int = 1) -> "ImageTransformer":
        """Mirror: 1 left-right, 0 up-down, -1 both."""
        return self._add("flip", flip_code=flipCode)

    def blur(self, height: int, width: int, sigma: float = 0.0) -> "ImageTransformer":
        """Gaussian blur with an odd ``height`` x ``width`` kernel."""
        return self._add("blur", height=height, width=width, sigma=sigma)

    def threshold(self, threshold: float, maxVal: float, type: Any = "binary") -> "ImageTransformer":
        """OpenCV threshold; ``type`` one of binary, binary_inv, trunc, tozero, tozero_inv (or, as in
        SynapseML, OpenCV's integer code of one of them)."""
        type = _THRESHOLD_CODES.get(type, type) if isinstance(type, int) else type
        return self._add("threshold", threshold=threshold, max_val=maxVal, type=type)

    def colorFormat(self, format: str) -> "ImageTransformer":  # noqa: N802
        """Convert to BGR, RGB, GRAY, BGRA or RGBA."""
        return self._add("color_format", format=format)

    def normalize(self, mean: Any, std: Any, colorScaleFactor: float = 1.0) -> "ImageTransformer":
        """``(x * colorScaleFactor - mean) / std`` per channel, as float32."""
        return self._add("normalize", mean=mean, std=std, color_scale_factor=colorScaleFactor)

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        fmt = self.getOutputFormat()
        dtype = {"image": _OUT_IMAGE, "array": ArrayType(FloatType()), "vector": VectorUDT()}[fmt]
        err = self.getErrorCol()
        return [(self.getOutputCol(), dtype)] + ([(err, StringType())] if err else [])

    def _validate_schema(self, schema: StructType) -> None:
        if not isinstance(schema[self.getInputCol()].dataType, BinaryType):
            _check_image_column(self, schema, self.getInputCol())

    def _make_batch_fn(self) -> BatchFn:
        return TransformKernel(self.getInputCol(), self.getOutputCol(), ImageChain(self.getOps()),
                               self.getOutputFormat(), self.getErrorCol())


class UnrollImage(_ImageStage):
    """Flatten an image struct into a Spark ML vector (CHW order, pixel values as doubles).

    Examples
    --------
    >>> UnrollImage(inputCol="image", outputCol="pixels").getOutputCol()
    'pixels'
    """

    _defaults = {"inputCol": "image", "outputCol": "unrolled"}

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        return [(self.getOutputCol(), VectorUDT())]

    def _validate_schema(self, schema: StructType) -> None:
        _check_image_column(self, schema, self.getInputCol())

    def _make_batch_fn(self) -> BatchFn:
        return UnrollKernel(self.getInputCol(), self.getOutputCol())


_AUGMENT_PARAMS: Any = table_mixin("HasAugmentParams", [
    ("flipLeftRight", "add a left-right mirrored copy", TypeConverters.toBoolean, True),
    ("flipUpDown", "add an up-down mirrored copy", TypeConverters.toBoolean, False),
    ("variantCol", "column naming each copy (empty: none)", TypeConverters.toString, "augmentation"),
    ("cropFraction", "add a closer view: the central share of the height and width, resized back "
     "(0: no such copy)", TypeConverters.toFloat, 0.0, in_range(0.0, 1.0, high_open=True)),
    ("exposureGain", "add a darker (< 1) or brighter (> 1) copy, pixel values times this gain "
     "(1: no such copy)", TypeConverters.toFloat, 1.0, in_range(0.0, low_open=True)),
])


class ImageSetAugmenter(_ImageStage, _AUGMENT_PARAMS):
    """Emit each image and its flipped, cropped and re-exposed copies as separate rows, keeping every
    other column.

    Rows keep their other columns (an id, a label), so scores of the copies can be averaged back
    per original image; ``variantCol`` names the copy (``original``, ``flipLeftRight``,
    ``flipUpDown``, ``crop``, ``exposure``). ``outputCol`` may equal ``inputCol`` to replace the image.

    Examples
    --------
    >>> ImageSetAugmenter(flipUpDown=True)._augmentations()
    ['flipLeftRight', 'flipUpDown']
    """

    _extras = ("images",)

    _defaults = {"inputCol": "image", "outputCol": "image"}

    def _augmentations(self) -> list[str]:
        return [name for name in AUGMENTATIONS if self.getOrDefault(getattr(self, name))]

    def _tmp(self) -> str:
        return f"__irbis_aug_{self.uid}"

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        variant = StructType().add("variant", StringType()).add("image", _OUT_IMAGE)
        return [(self._tmp(), ArrayType(variant))]

    def _validate_schema(self, schema: StructType) -> None:
        _check_image_column(self, schema, self.getInputCol())

    def _make_transform_fn(self) -> Any:
        in_col, tmp, augs = self.getInputCol(), self._tmp(), self._augmentations()
        crop, gain = self.getCropFraction(), self.getExposureGain()

        def augment(frame: pd.DataFrame) -> pd.DataFrame:
            values = frame[in_col].tolist()
            rows = augment_images(values, augs, crop=crop, exposure=gain)
            origins = [v["origin"] if v is not None else "" for v in values]
            return pd.DataFrame({tmp: [[{"variant": v, "image": _struct(img, origin)}
                                        for v, img in row] for row, origin in zip(rows, origins)]})

        return augment

    def _transform(self, dataset: Any) -> Any:
        out_col, tmp = self.getOutputCol(), self._tmp()
        variant_col = self.getOrDefault(self.variantCol)
        if isinstance(dataset, pd.DataFrame):
            out = self._transform_pandas(dataset).explode(tmp, ignore_index=True)
            out[out_col] = [d["image"] for d in out[tmp]]
            if variant_col:
                out[variant_col] = [d["variant"] for d in out[tmp]]
            return out.drop(columns=[tmp])
        out = self._transform_spark(dataset).withColumn(tmp, F.explode(tmp))
        out = out.withColumn(out_col, F.col(f"{tmp}.image"))
        if variant_col:
            out = out.withColumn(variant_col, F.col(f"{tmp}.variant"))
        return out.drop(tmp)
