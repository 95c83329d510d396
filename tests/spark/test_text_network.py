"""The text stages on Spark with real networks and real reviews: the catalogue's MiniLM equals
sentence-transformers, a Hugging Face classifier equals its own probabilities, a saved pipeline carries its
network, and `irbis serve` answers what transform answers."""
from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.feature import StringIndexer

from irbis.demo.reviews import drug_reviews
from irbis.ml import TextClassifierModel, TextEmbedder, TextTokenizer
from irbis.serving.server import BackgroundServer, build_app
from text_networks import minilm_classifier

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def reviews(spark):
    frame = drug_reviews().iloc[::8].reset_index(drop=True)  # 123 reviews, every length
    frame["id"] = range(len(frame))
    rows = (list(frame[["id", "review", "sentiment"]].itertuples(index=False, name=None))
            + [(len(frame), None, "neutral")])
    return frame, spark.createDataFrame(rows, "id int, review string, sentiment string").repartition(2)


def test_embeddings_on_spark_equal_sentence_transformers(reviews):
    from sentence_transformers import SentenceTransformer

    from irbis.models.text_networks import text_source

    frame, df = reviews
    out = TextEmbedder(inputCol="review", outputCol="e", errorCol="why").transform(df).orderBy("id").collect()
    assert out[-1].e is None and out[-1].why == "null text"
    ours = np.stack([r.e.toArray() for r in out[:-1]])
    theirs = SentenceTransformer(text_source("all_minilm_l6_v2")["folder"],
                                 device="cpu").encode(frame["review"].tolist())
    assert ((ours * theirs).sum(1) / np.linalg.norm(theirs, axis=1)).min() >= 0.9999


def test_a_classifier_gives_the_hugging_face_models_probabilities(reviews):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    frame, df = reviews
    folder = minilm_classifier()
    stage = TextClassifierModel(network=folder, inputCol="review")
    assert stage.labels == ["negative", "neutral", "positive"]
    out = stage.transform(df).orderBy("id").collect()[:10]
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    tokenizer.no_padding()  # the file pads to 128 for its own use
    tokenizer.enable_truncation(512)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    for row, text in zip(out, frame["review"][:10]):
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            want = torch.softmax(model(input_ids=ids).logits, -1)[0].numpy()
        np.testing.assert_allclose(row.probability.toArray(), want, atol=1e-4)
        assert row.prediction == float(want.argmax())


def test_a_saved_pipeline_carries_the_users_network(spark, reviews, tmp_path):
    _, df = reviews
    folder = tmp_path / "my-classifier"
    shutil.copytree(minilm_classifier(), folder)
    model = Pipeline(stages=[TextClassifierModel(network=str(folder), inputCol="review", engine="onnxruntime")]).fit(df)
    expected = [r.probability for r in model.transform(df).orderBy("id").limit(5).collect()]
    model.write().overwrite().save(str(tmp_path / "saved"))
    shutil.rmtree(folder)  # the saved stage holds its own copy
    again = PipelineModel.load(str(tmp_path / "saved"))
    got = [r.probability for r in again.transform(df).orderBy("id").limit(5).collect()]
    np.testing.assert_allclose(np.stack([g.toArray() for g in got]), np.stack([e.toArray() for e in expected]),
                               atol=1e-5)


def test_int8_calibrated_on_a_dataframe_keeps_its_sample_when_saved(spark, reviews, tmp_path):
    frame, df = reviews
    calibration = spark.createDataFrame(drug_reviews("train")[["review"]].iloc[:40])
    stage = TextEmbedder(inputCol="review", outputCol="e", precision="int8", calibrationData=calibration)
    assert sorted(p.name for p in Path(stage.getCalibrationData()).iterdir()) == ["texts.json"]
    stage.save(str(tmp_path / "int8"))
    loaded = TextEmbedder.load(str(tmp_path / "int8"))
    assert loaded.getCalibrationData() != stage.getCalibrationData()  # the stage's own copy
    int8 = np.stack([r.e.toArray() for r in loaded.transform(df).orderBy("id").collect()[:-1]])
    fp32 = np.stack([r.e.toArray() for r in TextEmbedder(inputCol="review", outputCol="e").transform(df)
                     .orderBy("id").collect()[:-1]])
    cosine = (int8 * fp32).sum(1) / np.linalg.norm(int8, axis=1)
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.95


def test_tokenizer_feeds_ids_and_a_wrong_column_type_is_named(spark, reviews):
    _, df = reviews
    ids = TextTokenizer(inputCol="review", outputCol="ids", maxLength=16).transform(df).orderBy("id").first().ids
    assert len(ids) == 16 and ids[0] == 101 and ids[-1] == 102
    with pytest.raises(TypeError, match="column 'id' must hold text.*int"):
        TextEmbedder(inputCol="id").transform(df)


def test_serving_a_text_pipeline_answers_what_transform_answers(spark, reviews, tmp_path):
    """Embeddings into a logistic regression over the sentiment: JSON texts in, probabilities out."""
    frame, df = reviews
    train = df.where("review is not null")
    pipeline = Pipeline(stages=[StringIndexer(inputCol="sentiment", outputCol="label"),
                                TextEmbedder(inputCol="review", outputCol="features"),
                                LogisticRegression(maxIter=30)]).fit(train)
    path = str(tmp_path / "served")
    pipeline.write().overwrite().save(path)
    texts = frame["review"][:6].tolist() + [""]
    expected = (pipeline.transform(spark.createDataFrame([(t, "positive") for t in texts],
                                                         "review string, sentiment string"))
                .select("probability").collect())
    with BackgroundServer(build_app(path)) as url:
        answer = httpx.post(f"{url}/predict", json=[{"review": t, "sentiment": "positive"} for t in texts],
                            timeout=120).json()
        bad = httpx.post(f"{url}/predict", json=[{"review": 12, "sentiment": "positive"}], timeout=60)
    for got, want in zip(answer, expected):
        np.testing.assert_allclose(got["probability"], want.probability.toArray(), atol=1e-4)
    assert 400 <= bad.status_code < 500


@pytest.mark.classic_only(reason="the command runs on its own session from --master local[2], a classic one")
def test_cli_embed_writes_the_embeddings_of_a_folder_of_text_files(spark, tmp_path, capsys):
    from irbis.cli import main

    folder = tmp_path / "notes"
    folder.mkdir()
    texts = {"a.txt": "The snow leopard crossed the ridge at dawn.", "b.txt": "Fog.", "c.txt": "Rain all night."}
    for name, text in texts.items():
        (folder / name).write_text(text)
    (folder / "d.txt").write_bytes(b"\xff\xfe not utf-8")
    out = tmp_path / "embedded"
    assert main(["embed", str(folder), "--output", str(out), "--master", "local[2]"]) == 0
    rows = {r.path.rsplit("/", 1)[-1]: r for r in spark.read.parquet(str(out)).collect()}
    expected = TextEmbedder(inputCol="t", outputCol="e").transform(
        spark.createDataFrame([(texts["a.txt"],)], "t string")).first().e
    np.testing.assert_allclose(rows["a.txt"].embedding, expected.toArray(), atol=1e-5)
    assert rows["b.txt"].embedding is not None and rows["b.txt"].error is None
    assert rows["d.txt"].embedding is None and "not UTF-8" in rows["d.txt"].error
    assert "embeddings of" in capsys.readouterr().out
    # the tools after Spark read the vectors as float32 lists, not as Spark ML's struct of type/size/indices/values
    import pandas as pd

    read = pd.read_parquet(out).set_index("path")
    vector = read.loc[next(p for p in read.index if p.endswith("a.txt")), "embedding"]
    assert vector.dtype == np.float32 and vector.shape == (384,)

    # a CSV keeps its columns' types; --vectors ml writes Spark ML vectors
    table = tmp_path / "notes.csv"
    table.write_text('id,text\n7,"The snow leopard crossed the ridge at dawn."\n8,Fog.\n')
    out_ml = tmp_path / "embedded_ml"
    assert main(["embed", str(table), "--output", str(out_ml), "--vectors", "ml", "--master", "local[2]"]) == 0
    written = spark.read.parquet(str(out_ml))
    assert dict(written.dtypes)["id"] == "int" and dict(written.dtypes)["embedding"] == "vector"
    np.testing.assert_allclose(written.where("id = 7").first().embedding.toArray(), expected.toArray(), atol=1e-5)
