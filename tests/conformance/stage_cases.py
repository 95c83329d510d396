"""The table of stage cases that the stage harness (test_stages.py) runs for every public stage.

Adding a stage to the harness is one entry in ``STAGE_CASES``::

    "MyStage": StageCase(
        make_stage=lambda: MyStage(inputCol="x", outputCol="y"),
        make_frame=lambda spark: spark.createDataFrame([(1.0,), (2.0,)], "x double"),
        input_col="x", wrong_type="string",
    ),

``connect=False`` marks a stage that needs the classic API: on Spark Connect it must refuse with
an error naming itself. ``make_stage`` builds the stage (an estimator is fitted on the frame; name the class it fits
in ``fitted``); ``make_frame`` builds a small input DataFrame whose schema the harness also
uses to generate random inputs with hypothesis (nulls, NaN, unicode, long strings, empty
frames and partitions, single rows), and renames every column to a name holding dots, spaces and
backticks (``renamable=False`` where a function or a nested stage names columns itself). ``input_col``
is a column the stage reads: the harness drops it and retypes it to ``wrong_type`` (a Spark SQL type
name) and expects an error that names it. Use module-level functions (not lambdas) where a stage
persists a function.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from irbis.ml.assembler import FastVectorAssembler
from irbis.ml.basic import Cache, DropColumns, Lambda, RenameColumn, Repartition, SelectColumns
from irbis.ml.ensemble_by_key import EnsembleByKey
from irbis.ml.featurize import Featurize
from irbis.ml.text import TextFeaturizer


@dataclass(frozen=True)
class StageCase:
    """One stage under test: how to build it and a small input for it."""

    make_stage: Callable[[], Any]
    make_frame: Callable[[SparkSession], DataFrame]
    input_col: str | None = None
    wrong_type: str | None = None
    fitted: str | None = None
    keeps_rows: bool = True
    generated: bool = True
    pandas: bool = True
    connect: bool = True
    renamable: bool = True  # False where a nested stage or a function names columns the harness cannot rename


def mixed_frame(spark: SparkSession) -> DataFrame:
    """Numbers, a boolean, text, a short vector, a date and a timestamp; with missing values."""
    import datetime as dt

    schema = StructType([
        StructField("key", StringType()), StructField("x", DoubleType()), StructField("n", IntegerType()),
        StructField("flag", BooleanType()), StructField("text", StringType()), StructField("vec", VectorUDT()),
        StructField("day", DateType()), StructField("ts", TimestampType()),
    ])
    rows = [
        ("a", 1.0, 1, True, "The quick brown fox", Vectors.dense([1.0, 2.0]), dt.date(2024, 1, 1),
         dt.datetime(2024, 1, 1, 8)),
        ("a", 3.0, None, False, "jumps over the lazy dog", Vectors.sparse(2, [1], [4.0]), dt.date(2024, 2, 29), None),
        ("b", float("nan"), 5, None, None, None, None, dt.datetime(2024, 3, 1, 23, 59, 59)),
        ("c", -2.5, 7, True, "Ünïcode façade 東京", Vectors.dense([0.5, -1.0]), dt.date(1999, 12, 31),
         dt.datetime(2000, 1, 1)),
    ]
    return spark.createDataFrame(rows, schema)


def tokens_frame(spark: SparkSession) -> DataFrame:
    """Pre-tokenised text (array<string>)."""
    return spark.createDataFrame([(["a", "b", "a"],), ([],), (None,)],
                                 StructType([StructField("tokens", ArrayType(StringType()))]))


def add_x_squared(df: Any) -> Any:
    """A user function for ``Lambda``: append ``x * x`` (Spark or pandas)."""
    if hasattr(df, "withColumn"):
        return df.withColumn("x2", F.col("x") * F.col("x"))
    out = df.copy()
    out["x2"] = out["x"] * out["x"]
    return out


STAGE_CASES: dict[str, StageCase] = {
    "EnsembleByKey": StageCase(
        lambda: EnsembleByKey(keys=["key"], cols=["x", "vec"]), mixed_frame, "x", "string", keeps_rows=False,
    ),
    "EnsembleByKeyKeepRows": StageCase(
        lambda: EnsembleByKey(keys=["key"], cols=["x", "vec"], strategy="max", collapseGroup=False),
        mixed_frame, "vec", "string",
    ),
    "TextFeaturizer": StageCase(
        lambda: TextFeaturizer(inputCol="text", outputCol="tf", numFeatures=64, useStopWordsRemover=True,
                               useNGram=True),
        mixed_frame, "text", "int", fitted="TextFeaturizerModel",
    ),
    "TextFeaturizerTokens": StageCase(
        lambda: TextFeaturizer(inputCol="tokens", outputCol="tf", numFeatures=32, useTokenizer=False, binary=True),
        tokens_frame, "tokens", "string", fitted="TextFeaturizerModel",
    ),
    "Featurize": StageCase(
        lambda: Featurize(inputCols=["x", "n", "flag", "text", "vec", "day", "ts"], outputCol="features",
                          maxCategories=2),
        mixed_frame, "day", "array<int>", fitted="FeaturizeModel",
    ),
    "FastVectorAssembler": StageCase(
        lambda: FastVectorAssembler(inputCols=["x", "n", "flag", "vec"], outputCol="features", handleInvalid="keep"),
        mixed_frame, "n", "string",
    ),
    "Repartition": StageCase(lambda: Repartition(numPartitions=3, partitionCols=["key"]), mixed_frame, "key"),
    "Cache": StageCase(lambda: Cache(storageLevel="MEMORY_ONLY"), mixed_frame),
    "SelectColumns": StageCase(lambda: SelectColumns(cols=["ts", "x"]), mixed_frame, "ts"),
    "DropColumns": StageCase(lambda: DropColumns(cols=["text", "vec"]), mixed_frame, "text"),
    "RenameColumn": StageCase(lambda: RenameColumn(inputCol="x", outputCol="renamed"), mixed_frame, "x"),
    "Lambda": StageCase(lambda: Lambda(function=add_x_squared), mixed_frame, "x", renamable=False),
}


def tiny_torch_model() -> Any:
    """A seeded 2 -> 3 linear network over the 2-element ``vec`` column."""
    import torch

    from irbis.ml.torch_model import TorchModel

    torch.manual_seed(0)
    return TorchModel.from_module(torch.nn.Linear(2, 3), inputCol="vec", outputCol="scores", inputShape=[2])


_ONNX_FILES: dict[str, str] = {}


def tiny_onnx_model() -> Any:
    """A 2 -> 3 MatMul graph written once per test run, over the 2-element ``vec`` column."""
    import os
    import tempfile

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from irbis.ml.onnx_model import ONNXModel

    if "path" not in _ONNX_FILES:
        weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) / 6, name="w")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])], initializer=[weight],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8  # readable by older ONNX Runtime builds too
        path = os.path.join(tempfile.mkdtemp(prefix="irbis-onnx-"), "tiny.onnx")
        onnx.save(model, path)
        _ONNX_FILES["path"] = path
    return ONNXModel(network=_ONNX_FILES["path"], inputCol="vec", outputCol="scores")


def sequences_frame(spark: SparkSession) -> DataFrame:
    """Token ids of varying length (a null row among them)."""
    rows = [([3, 1, 4, 1, 5],), ([9],), (None,), ([2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2],), ([3, 8],)]
    return spark.createDataFrame(rows, StructType([StructField("ids", ArrayType(IntegerType()))]))


def tiny_sequence_torch_model() -> Any:
    """A seeded masked-mean network over the variable-length ``ids`` column, with an error column."""
    import torch

    from irbis.ml.torch_model import TorchModel
    from tests.sequence_networks import MeanOfIds

    torch.manual_seed(0)
    return TorchModel.from_module(MeanOfIds(), inputCol="ids", outputCol="scores", variableLength=True,
                                  errorCol="why", tokenBudget=16, miniBatchSize=2)


def tiny_sequence_onnx_model() -> Any:
    """The masked-mean network exported to ONNX with dynamic batch and sequence axes, over ``ids``."""
    import os
    import tempfile
    import warnings

    import torch

    from irbis.ml.onnx_model import ONNXModel
    from tests.sequence_networks import MeanOfIds

    if "sequences" not in _ONNX_FILES:
        torch.manual_seed(0)
        path = os.path.join(tempfile.mkdtemp(prefix="irbis-onnx-"), "sequences.onnx")
        example = (torch.ones(2, 8, dtype=torch.int64), torch.ones(2, 8, dtype=torch.int64))
        axes = {0: "batch", 1: "steps"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(MeanOfIds().eval(), example, path, input_names=["input_ids", "attention_mask"],
                              output_names=["logits"], dynamic_axes={"input_ids": axes, "attention_mask": axes},
                              dynamo=False)
        _ONNX_FILES["sequences"] = path
    return ONNXModel(network=_ONNX_FILES["sequences"], inputCol="ids", outputCol="scores", variableLength=True,
                     tokenBudget=16, miniBatchSize=2)


STAGE_CASES.update({
    "TorchModel": StageCase(tiny_torch_model, mixed_frame, "vec", "string", pandas=False),
    "ONNXModel": StageCase(tiny_onnx_model, mixed_frame, "vec", "string", pandas=False),
    "TorchModelSequences": StageCase(tiny_sequence_torch_model, sequences_frame, "ids", "string"),
    # generated rows hold empty sequences, which fail an ONNXModel (it has no errorCol)
    "ONNXModelSequences": StageCase(tiny_sequence_onnx_model, sequences_frame, "ids", "string", generated=False),
})


def registered_names() -> set[str]:
    """Class names the table covers: the stages built by the cases and the models they fit."""
    names = {type(case.make_stage()).__name__ for case in STAGE_CASES.values()}
    return names | {case.fitted for case in STAGE_CASES.values() if case.fitted}



def image_frame(spark: SparkSession) -> DataFrame:
    """Two real photographs as image structs and PNG bytes, and one row of bytes that is no image."""
    import cv2
    from pyspark.sql.types import BinaryType
    from skimage import data

    from irbis.kernels.image.decode import array_to_struct
    from irbis.spark.images import IMAGE_STRUCT

    photos = [data.chelsea()[::4, ::4, ::-1], data.coffee()[::8, ::8, ::-1]]
    rows = [(i, array_to_struct(p, f"photo{i}"), cv2.imencode(".png", p)[1].tobytes()) for i, p in enumerate(photos)]
    rows.append((2, None, b"not an image"))
    schema = StructType([StructField("id", IntegerType()), StructField("image", IMAGE_STRUCT, True),
                         StructField("content", BinaryType(), True)])
    return spark.createDataFrame(rows, schema)


def tiny_image_transformer() -> Any:
    from irbis.ml.image import ImageTransformer

    return (ImageTransformer(inputCol="image", outputCol="t", outputFormat="vector")
            .resize(20, 20, keepAspectRatio=True).centerCrop(16, 16).colorFormat("RGB").normalize(127.0, 128.0))


def labelled_frame(spark: SparkSession) -> DataFrame:
    """Eight 2-d points in two classes, for training."""
    rows = [(Vectors.dense([float(i), float(i % 2)]), i % 2) for i in range(8)]
    return spark.createDataFrame(rows, StructType([StructField("vec", VectorUDT()),
                                                   StructField("label", IntegerType())]))


def tiny_estimator() -> Any:
    from irbis.ml.estimator import TorchEstimator

    return TorchEstimator(network="mlp", networkOptions='{"in_features": 2, "hidden": 4, "out_features": 2}',
                          inputCol="vec", labelCol="label", epochs=1, batchSize=4, numWorkers=1,
                          showProgress=False)


def _image_stages() -> dict[str, StageCase]:
    from irbis.ml.image import ImageDecoder, ImageSetAugmenter, UnrollImage
    from irbis.ml.image_featurizer import ImageFeaturizer

    no_gen = dict(wrong_type="string", generated=False)
    return {
        "ImageDecoder": StageCase(lambda: ImageDecoder(inputCol="content", outputCol="decoded"), image_frame,
                                  "content", **no_gen),
        "ImageTransformer": StageCase(tiny_image_transformer, image_frame, "image", **no_gen),
        "UnrollImage": StageCase(lambda: UnrollImage(inputCol="image", outputCol="u"), image_frame, "image", **no_gen),
        "ImageSetAugmenter": StageCase(lambda: ImageSetAugmenter(inputCol="image", outputCol="image", flipUpDown=True),
                                       image_frame, "image", keeps_rows=False, **no_gen),
        "ImageFeaturizer": StageCase(lambda: ImageFeaturizer(inputCol="content", outputCol="f", errorCol="why"),
                                     image_frame, "content", **no_gen),
    }


def tiny_fused_stages() -> Any:
    """ImageTransformer (8x8 RGB pixels) fused with a seeded network over them."""
    import torch

    from irbis.ml.fused import fuse
    from irbis.ml.image import ImageTransformer
    from irbis.ml.torch_model import TorchModel

    torch.manual_seed(0)
    small = ImageTransformer(inputCol="image", outputCol="small").resize(8, 8).colorFormat("RGB")
    net = TorchModel.from_module(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 2)),
                                 inputCol="small", outputCol="scores", inputShape=[3, 8, 8])
    return fuse([small, net]).stages[0]


STAGE_CASES.update(_image_stages())
STAGE_CASES["FusedStages"] = StageCase(tiny_fused_stages, image_frame, "image", wrong_type="string",
                                       generated=False, renamable=False)
STAGE_CASES["TorchEstimator"] = StageCase(tiny_estimator, labelled_frame, "vec", "string", fitted="TorchModel",
                                          generated=False, pandas=False)


#: 8x8 RGB inputs, mean 127.5 and std 64 per channel: a preprocessing record small enough for the harness.
TINY_PREPROCESSING = {"input_size": [8, 8], "mean": [127.5] * 3, "std": [64.0] * 3, "resize_to": None,
                      "interpolation": "area", "color_order": "RGB"}


def tiny_image_classifier_model() -> Any:
    """A seeded 2-class network over 8x8 RGB images, scoring encoded files (one is no image: errorCol)."""
    import torch

    from irbis.ml.image_classifier import ImageClassifierModel

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 2))
    return ImageClassifierModel.from_module(net, TINY_PREPROCESSING, inputCol="content", errorCol="why")


def labelled_images(spark: SparkSession) -> DataFrame:
    """Twelve 40x40 JPEG crops of two photographs, labelled by photograph, as image structs."""
    import cv2
    from skimage import data

    from irbis.kernels.image.decode import array_to_struct
    from irbis.spark.images import IMAGE_STRUCT

    rows = []
    for label, photo in enumerate([data.chelsea(), data.coffee()]):
        for i in range(6):
            crop = cv2.resize(photo[i * 20:i * 20 + 200, i * 30:i * 30 + 200, ::-1], (40, 40))
            rows.append((array_to_struct(crop, f"p{label}-{i}"), label))
    return spark.createDataFrame(rows, StructType([StructField("image", IMAGE_STRUCT, True),
                                                   StructField("label", IntegerType())]))


def tiny_image_classifier() -> Any:
    """ImageClassifier on the catalogue's small CIFAR network (32x32 inputs, no shipped weights), one epoch."""
    from irbis.ml.image_classifier import ImageClassifier

    return ImageClassifier(backbone="small_cnn_cifar", inputCol="image", numClasses=2, epochs=1, batchSize=4,
                           numWorkers=1, showProgress=False)


STAGE_CASES["ImageClassifierModel"] = StageCase(tiny_image_classifier_model, image_frame, "content",
                                                wrong_type="string", generated=False)
STAGE_CASES["ImageClassifier"] = StageCase(tiny_image_classifier, labelled_images, "image", "string",
                                           fitted="ImageClassifierModel", generated=False, pandas=False)


def tiny_image_lime() -> Any:
    """ImageLIME over an 8x8-pixel network (the fused stages' pipeline), few samples."""
    from pyspark.ml import PipelineModel

    from irbis.ml.lime import ImageLIME

    model = PipelineModel(tiny_fused_stages().stages)
    return ImageLIME(model=model, inputCol="image", targetCol="scores", targetClasses=[0, 1], numSamples=40,
                     cellSize=16.0, miniBatchSize=20)


def tiny_tabular_lime() -> Any:
    """TabularLIME over the seeded 2 -> 3 network on ``vec``."""
    from irbis.ml.lime import TabularLIME

    return TabularLIME(model=tiny_torch_model(), inputCol="vec", targetCol="scores", targetClasses=[0, 2],
                       numSamples=20)


STAGE_CASES["ImageLIME"] = StageCase(tiny_image_lime, image_frame, "image", wrong_type="string", generated=False,
                                     renamable=False)
STAGE_CASES["TabularLIME"] = StageCase(tiny_tabular_lime, mixed_frame, "vec", "string", fitted="TabularLIMEModel",
                                       renamable=False)


def _text_network(task: str) -> str:
    from text_networks import tiny_text_network

    return tiny_text_network(task)


def tiny_text_embedder() -> Any:
    from irbis.ml.text_network import TextEmbedder

    return TextEmbedder(network=_text_network("embedding"), inputCol="text", outputCol="emb", engine="torch")


def tiny_text_classifier() -> Any:
    from irbis.ml.text_network import TextClassifierModel

    return TextClassifierModel(network=_text_network("classification"), inputCol="text", engine="torch",
                               errorCol="why")


def tiny_text_tokenizer() -> Any:
    from irbis.ml.text_network import TextTokenizer

    return TextTokenizer(network=_text_network("embedding"), inputCol="text", outputCol="ids", maxLength=32)


STAGE_CASES.update({
    "TextEmbedder": StageCase(tiny_text_embedder, mixed_frame, "text", "int"),
    "TextClassifierModel": StageCase(tiny_text_classifier, mixed_frame, "text", "array<int>"),
    "TextTokenizer": StageCase(tiny_text_tokenizer, mixed_frame, "text", "double"),
})


def tiny_text_lime() -> Any:
    """TextLIME over the tiny text classifier, few samples (texts with more words get a reason)."""
    from irbis.ml.lime import TextLIME

    return TextLIME(model=tiny_text_classifier(), inputCol="text", targetClasses=[0, 2], numSamples=24,
                    miniBatchSize=12)


STAGE_CASES["TextLIME"] = StageCase(tiny_text_lime, mixed_frame, "text", "int", renamable=False)


def labelled_texts(spark: SparkSession) -> DataFrame:
    """Sixteen short texts of two kinds, with a label each."""
    rows = [(f"review {i} was {'fine' if i % 2 else 'awful'}", i % 2) for i in range(16)]
    return spark.createDataFrame(rows, StructType([StructField("text", StringType()),
                                                   StructField("label", IntegerType())]))


def tiny_text_classifier_estimator() -> Any:
    """TextClassifier on the tiny BERT encoder, one epoch on one worker."""
    from irbis.ml.text_classifier import TextClassifier

    return TextClassifier(backbone=_text_network("embedding"), inputCol="text", numClasses=2, epochs=1, batchSize=4,
                          maxLength=32, numWorkers=1, showProgress=False)


STAGE_CASES["TextClassifier"] = StageCase(tiny_text_classifier_estimator, labelled_texts, "text", "int",
                                          fitted="TextClassifierModel", generated=False, pandas=False)
