"""SynapseML's documented Python examples, ported to Irbis on data that ships with the test packages.

Each test keeps the example's calls (SynapseML's names, through Irbis's aliases) and asserts the
results against an independent computation: scikit-learn, PyTorch, or SparkML's own stages.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from pyspark.ml.feature import IDF, HashingTF, RegexTokenizer, VectorAssembler
from pyspark.ml.linalg import Vectors
from pyspark.sql.types import FloatType

from irbis import ONNXModel
from irbis.ml.ensemble_by_key import EnsembleByKey
from irbis.ml.image import ImageTransformer
from irbis.ml.image_featurizer import ImageFeaturizer
from irbis.ml.params import ParamValueError
from irbis.ml.synapseml import IMAGE_FEATURIZER_ALIASES, IMAGE_TRANSFORMER_ALIASES, ONNX_ALIASES
from irbis.ml.text import TextFeaturizer
from irbis.spark.images import read_images

pytestmark = pytest.mark.spark

# ImageNet-1k classes of the scikit-image photos (as in test_featurizer.py).
CATS, COFFEE = {281, 282, 285}, 967


@pytest.fixture(scope="module")
def iris_model():
    """scikit-learn's multinomial logistic regression on iris, as an ONNX graph built with onnx.helper."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    clf = LogisticRegression(max_iter=500).fit(x, y)
    weight = numpy_helper.from_array(clf.coef_.T.astype(np.float32), name="w")
    bias = numpy_helper.from_array(clf.intercept_.astype(np.float32), name="b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["float_input", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"])],
        "iris", [helper.make_tensor_value_info("float_input", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 3])], initializer=[weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return x, clf, model.SerializeToString()


def test_onnx_tabular_quickstart(spark, iris_model, tmp_path):
    """SynapseML's ONNX quickstart: a tabular classifier's graph, probabilities and predicted labels."""
    x, clf, payload = iris_model
    df = spark.createDataFrame([(i, Vectors.dense(r.tolist())) for i, r in enumerate(x)], ["id", "features"])
    onnx_ml = (ONNXModel()
               .setModelPayload(payload)
               .setFeedDict({"float_input": "features"})
               .setFetchDict({"rawPrediction": "logits"})
               .setSoftMaxDict({"rawPrediction": "probability"})
               .setArgMaxDict({"rawPrediction": "prediction"})
               .setDeviceType("CPU")
               .setOptimizationLevel("BASIC_OPT")
               .setMiniBatchSize(16))
    onnx_ml.save(str(tmp_path / "onnx"))  # the graph's bytes are saved with the stage
    loaded = ONNXModel.load(str(tmp_path / "onnx"))
    assert loaded.getModelPayload() == payload and loaded.getSoftMaxDict() == {"rawPrediction": "probability"}
    rows = sorted(loaded.transform(df).select("id", "probability", "prediction").collect())
    probability = np.stack([r.probability.toArray() for r in rows])
    np.testing.assert_allclose(probability, clf.predict_proba(x), atol=1e-5)
    np.testing.assert_array_equal([r.prediction for r in rows], clf.predict(x).astype(float))


def test_onnx_params_are_checked_when_set(iris_model):
    stage = ONNXModel()
    with pytest.raises(ParamValueError, match="optimizationLevel='FAST'.*'NO_OPT', 'BASIC_OPT'"):
        stage.setOptimizationLevel("FAST")
    with pytest.raises(ParamValueError, match="deviceType='TPU'.*'CPU', 'CUDA'"):
        stage.setDeviceType("TPU")
    assert stage.setDeviceType("cuda").getDevice() == "cuda" and stage.getDeviceType() == "CUDA"
    with pytest.raises(TypeError, match="dict of column name -> column name"):
        stage.setSoftMaxDict({"rawPrediction": 3})
    stage = ONNXModel(modelPayload=iris_model[2], feedDict={"float_input": "features"},
                      fetchDict={"raw": "logits"}, argMaxDict={"nope": "prediction"})
    with pytest.raises(ValueError, match="argMaxDict reads column 'nope'.*outputs are \\['raw'\\]"):
        stage._check_heads()


@pytest.fixture(scope="module")
def effnet_onnx(tmp_path_factory):
    from irbis.models import ModelRepository

    net = ModelRepository().load_model("efficientnet_lite0").eval()
    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(1, 3, 224, 224),), buffer, input_names=["data"], output_names=["logits"],
                      dynamic_axes={"data": {0: "n"}, "logits": {0: "n"}}, dynamo=False)
    return net, buffer.getvalue()


def test_onnx_image_classification(spark, tiny_images, effnet_onnx):
    """SynapseML's ONNX image example: ImageTransformer to a tensor, ONNXModel with softmax and argmax."""
    net, payload = effnet_onnx
    folder = str(next(iter(tiny_images.values())).parent)
    images = read_images(folder)
    transformer = (ImageTransformer(inputCol="image", outputCol="features")
                   .resize(256, True).centerCrop(224, 224)
                   .normalize([127.0, 127.0, 127.0], [128.0, 128.0, 128.0], 1.0)
                   .setTensorElementType(FloatType()).setTensorChannelOrder("RGB").setToTensor(True))
    onnx = (ONNXModel().setModelPayload(payload).setFeedDict({"data": "features"})
            .setFetchDict({"rawPrediction": "logits"}).setSoftMaxDict({"rawPrediction": "probability"})
            .setArgMaxDict({"rawPrediction": "prediction"}).setMiniBatchSize(2))
    tensors = transformer.transform(images)
    scored = onnx.transform(tensors).select("path", "features", "probability", "prediction").collect()
    by_name = {r.path.rsplit("/", 1)[-1].split(".")[0]: r for r in scored}
    assert int(by_name["chelsea"].prediction) in CATS and int(by_name["coffee"].prediction) == COFFEE
    pixels = torch.tensor(np.stack([r.features for r in scored]), dtype=torch.float32).reshape(-1, 3, 224, 224)
    with torch.no_grad():
        expected = torch.softmax(net(pixels), dim=1).numpy()
    np.testing.assert_allclose(np.stack([r.probability.toArray() for r in scored]), expected, atol=1e-4)


def test_image_featurizer_transfer_learning(spark, tiny_images):
    """SynapseML's transfer-learning example: a headless featurizer; bad files tolerated."""
    folder = str(next(iter(tiny_images.values())).parent)
    files = spark.read.format("binaryFile").load(folder).select("path", "content")
    broken = spark.createDataFrame([("broken.jpg", b"\xff\xd8 truncated")], "path string, content binary")
    featurizer = (ImageFeaturizer().setInputCol("content").setOutputCol("features").setModel("efficientnet_lite0")
                  .setHeadless(True).setIgnoreDecodingErrors(True).setMiniBatchSize(2))
    rows = {r.path.rsplit("/", 1)[-1]: r for r in featurizer.transform(files.union(broken)).collect()}
    assert featurizer.getCutOutputLayers() == 1 and featurizer.getErrorCol() == "error"
    assert all(rows[f"{n}.jpg"].features.size == 1280 for n in ("chelsea", "coffee", "rocket"))
    assert rows["broken.jpg"].features is None and "truncated" in rows["broken.jpg"].error
    head = featurizer.setHeadless(False).transform(files).collect()
    assert all(r.features.size == 1000 for r in head)


def test_text_featurizer_example(spark):
    """SynapseML's TextFeaturizer example, compared with SparkML's tokenizer, hashing and IDF."""
    df_raw = spark.createDataFrame([
        (0, "Hi I"), (1, "I wish for snow today"), (2, "we Cant go to the park, because of the snow!"), (3, ""),
    ], ["label", "sentence"])
    tf_raw = TextFeaturizer().setInputCol("sentence").setOutputCol("features").setNumFeatures(20)
    got = {r.label: r.features for r in tf_raw.fit(df_raw).transform(df_raw).collect()}
    tokens = RegexTokenizer(inputCol="sentence", outputCol="t", pattern="\\s+").transform(df_raw)
    tf = HashingTF(inputCol="t", outputCol="tf", numFeatures=20).transform(tokens)
    expected = {r.label: r.f for r in IDF(inputCol="tf", outputCol="f").fit(tf).transform(tf).collect()}
    for label in range(4):
        np.testing.assert_allclose(got[label].toArray(), expected[label].toArray())
    assert got[3].numNonzeros() == 0
    assert tf_raw.setStopWords("a, the").getStopWords() == ["a", "the"]


def test_ensemble_by_key_example(spark):
    """SynapseML's EnsembleByKey example, with vectors and vectorDims."""
    score_df = spark.createDataFrame([(0, "foo", 1.0, .1), (1, "bar", 4.0, -2.0), (1, "bar", 0.0, -3.0)],
                                     ["label1", "label2", "score1", "score2"])
    score_df2 = VectorAssembler().setInputCols(["score1", "score2"]).setOutputCol("v1").transform(score_df)
    ebk = EnsembleByKey().setKeys(["label1"]).setCols(["score1"])
    assert {r.label1: r["mean(score1)"] for r in ebk.transform(score_df2).collect()} == {0: 1.0, 1: 2.0}
    ebk2 = (EnsembleByKey().setKeys(["label1", "label2"]).setCols(["score1", "v1"])
            .setColNames(["s", "v"]).setCollapseGroup(False).setVectorDims({"v1": 2}))
    rows = ebk2.transform(score_df2).collect()
    assert len(rows) == 3 and ebk2.getVectorDims() == {"v1": 2}
    bar = [r for r in rows if r.label1 == 1]
    assert all(r.s == 2.0 and list(r.v) == [2.0, -2.5] for r in bar)
    wrong = ebk2.copy().setVectorDims({"v1": 3})
    with pytest.raises(Exception, match="different lengths \\(expected 3\\)"):
        wrong.transform(score_df2).collect()


def test_aliases_set_the_irbis_param_and_are_no_params():
    """An alias is no second Param: it sets the Irbis Param, which is all that is saved."""
    stage = ImageTransformer().setToTensor(True).setIgnoreDecodingErrors(True)
    assert stage.getOutputFormat() == "array" and stage.getErrorCol() == "error"
    names = {p.name for p in stage.params}
    for aliases in (IMAGE_TRANSFORMER_ALIASES, IMAGE_FEATURIZER_ALIASES, ONNX_ALIASES):
        assert not {a.name for a in aliases} & names - {a.target for a in aliases}
    assert "toTensor" not in names and "deviceType" not in {p.name for p in ONNXModel().params}
    with pytest.raises(ParamValueError, match="toTensor='yes'"):
        stage.setToTensor("yes")
    with pytest.raises(ParamValueError, match="tensorElementType"):
        stage.setTensorElementType("double")
    maps = [{"stageName": "resize", "size": 16, "keepAspectRatio": True}, {"stageName": "centercrop", "height": 8,
            "width": 8}, {"stageName": "threshold", "threshold": 5.0, "maxVal": 9.0, "type": 1},
            {"stageName": "gaussiankernel", "apertureSize": 3, "sigma": 1.0}]
    by_methods = ImageTransformer().resize(16, True).centerCrop(8, 8).threshold(5.0, 9.0, 1).gaussianKernel(3, 1.0)
    without_defaults = [{k: v for k, v in op.items() if k != "interpolation"} for op in by_methods.getOps()]
    assert ImageTransformer().setStages(maps).getOps() == without_defaults
    with pytest.raises(ParamValueError, match="stages=.*'blur'"):
        stage.setStages([{"stageName": "blur", "height": 3.0, "width": 3.0}])
    # gaussianKernel is the vertical Gaussian filter SynapseML applies (up to rounding of 8-bit pixels).
    img = np.zeros((9, 9, 3), np.uint8)
    img[4, 4] = 255
    import cv2
    out = ImageTransformer(outputFormat="image").gaussianKernel(5, 1.0)
    blurred = out._make_batch_fn()({"image": [{"origin": "", "height": 9, "width": 9, "nChannels": 3, "mode": 16,
                                               "data": img.tobytes()}]})["transformed"]
    expected = cv2.filter2D(img, -1, cv2.getGaussianKernel(5, 1.0))
    np.testing.assert_allclose(blurred.image(0).astype(int), expected.astype(int), atol=1)
    assert blurred.image(0)[:, 4, 0].sum() > 200 and blurred.image(0)[4, :, 0].sum() < 110  # vertical only


def test_synapseml_doc_lists_every_alias():
    from pathlib import Path

    from irbis.ml.synapseml import ENSEMBLE_ALIASES, TEXT_FEATURIZER_ALIASES

    doc = (Path(__file__).parents[2] / "docs" / "synapseml.md").read_text()
    for aliases in (ONNX_ALIASES, IMAGE_TRANSFORMER_ALIASES, IMAGE_FEATURIZER_ALIASES, TEXT_FEATURIZER_ALIASES,
                    ENSEMBLE_ALIASES):
        for alias in aliases:
            assert f"`{alias.name}`" in doc, alias.name
    for name in ("softMaxDict", "argMaxDict", "optimizationLevel", "gaussianKernel(", "tensorChannelOrder`",
                 "tensorElementType`"):
        assert f"`{name}" in doc, name
