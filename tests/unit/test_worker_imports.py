"""What a Spark Python worker imports when it unpickles a stage's function: the kernels, not the stages.

A worker unpickles a task's function before its first row, and imports every module the function refers
to by name. The stages' modules import ``pyspark.ml`` (about 0.7 s in a fresh worker) and the stages' Params
import the network registry, and with it torch (about 1 s): a first job's workers paid both before the
first image. The functions of the image and text stages refer to the kernels and to the worker helpers of
``irbis.spark`` only, so an image job on ONNX Runtime or OpenVINO never imports torch, and the others import
it at the first batch, when the engine loads.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pyspark import cloudpickle
from pyspark.sql.types import ArrayType, FloatType

from irbis.ml.base import _make_arrow_udf

READ_BACK = """
import json, pickle, sys
pickle.loads(sys.stdin.buffer.read())
# stages: the modules under irbis.ml (the table of irbis.ml itself is no stage)
print(json.dumps({"pyspark.ml": "pyspark.ml" in sys.modules, "torch": "torch" in sys.modules,
                  "stages": sorted(m for m in sys.modules if m.startswith("irbis.ml."))}))
"""


def _image_featurizer():
    from irbis.ml.image_featurizer import ImageFeaturizer

    return ImageFeaturizer(network="efficientnet_lite0", inputCol="content", outputLayer="_blocks.12", outputCol="f")


def _text_embedder():
    from irbis.ml.text_network import TextEmbedder
    from text_networks import tiny_text_network

    return TextEmbedder(network=tiny_text_network("embedding"), inputCol="text", outputCol="emb")


def _text_classifier():
    from irbis.ml.text_network import TextClassifierModel
    from text_networks import tiny_text_network

    return TextClassifierModel(network=tiny_text_network("classification"), inputCol="text", errorCol="why")


@pytest.mark.parametrize("make", [_image_featurizer, _text_embedder, _text_classifier],
                         ids=["ImageFeaturizer", "TextEmbedder", "TextClassifierModel"])
def test_a_worker_unpickles_a_stage_function_without_the_stages_or_torch(make):
    stage = make()
    udf = _make_arrow_udf(stage._make_batch_fn(), stage._input_columns(), [("out", ArrayType(FloatType()))], 1 << 20)
    shipped = cloudpickle.dumps(udf.func)  # the function Spark ships, as the worker reads it
    done = subprocess.run([sys.executable, "-c", READ_BACK], input=shipped, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    found = json.loads(done.stdout)
    assert found == {"pyspark.ml": False, "torch": False, "stages": []}, found
