"""Training on images: fine-tuning a pretrained network on photographs, streamed and augmented in the
workers, reproducible under one seed, with bad input named before any step."""
import json

import cv2
import numpy as np
import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.linalg import Vectors
from skimage import data

from irbis.kernels.image.decode import array_to_struct
from irbis.ml import ImageClassifier, ImageClassifierModel, TorchEstimator
from irbis.ml.params import ParamValueError
from irbis.spark.images import IMAGE_STRUCT

pytestmark = pytest.mark.spark

PHOTOS = [data.chelsea(), data.coffee()]  # RGB


def crops(n_per_class, size, seed, jpeg=True):
    """Random square crops of the cat (label 0) and the coffee cup (label 1), as JPEG bytes or BGR arrays."""
    rng = np.random.default_rng(seed)
    rows = []
    for label, photo in enumerate(PHOTOS):
        h, w = photo.shape[:2]
        for _ in range(n_per_class):
            s = int(rng.integers(min(h, w) // 3, min(h, w)))
            y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            bgr = cv2.resize(np.ascontiguousarray(photo[y:y + s, x:x + s, ::-1]), (size, size))
            rows.append((cv2.imencode(".jpg", bgr)[1].tobytes() if jpeg else bgr, label))
    return rows


@pytest.fixture(scope="module")
def photo_frames(spark):
    train = spark.createDataFrame(crops(16, 160, 0), "content binary, label int").repartition(2)
    test = spark.createDataFrame(crops(8, 160, 1), "content binary, label int")
    return train, test


@pytest.mark.classic_only(reason="a slow fit of EfficientNet-Lite0; the conformance harness fits ImageClassifier "
                                 "on Spark Connect")
def test_fine_tuning_a_pretrained_network_on_photographs_beats_chance(photo_frames, tmp_path):
    train, test = photo_frames
    clf = ImageClassifier(imageCol="content", numClasses=2, epochs=1, batchSize=8, freezeUntil="_blocks.14",
                          validationFraction=0.25, showProgress=False, seed=3)
    model = clf.fit(train)
    assert isinstance(model, ImageClassifierModel)
    record = model.training_summary[-1]
    assert set(record) >= {"loss", "validationLoss", "accuracy", "auc", "samplesPerSecond"}
    out = model.transform(test).toPandas()
    accuracy = float((out["prediction"] == out["label"]).mean())
    assert accuracy >= 0.85, accuracy  # chance is 0.5
    probs = np.stack([v.toArray() for v in out["probability"]])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    assert np.array_equal(probs.argmax(1), out["prediction"].to_numpy())
    PipelineModel([model]).write().overwrite().save(str(tmp_path / "pipe"))
    again = PipelineModel.load(str(tmp_path / "pipe")).stages[0]
    assert again.training_summary == model.training_summary
    probs2 = np.stack([v.toArray() for v in again.transform(test).toPandas()["probability"]])
    np.testing.assert_allclose(probs2, probs, atol=1e-5)


@pytest.mark.classic_only(reason="a slow fit of EfficientNet-Lite0; the conformance harness fits ImageClassifier "
                                 "on Spark Connect")
def test_frozen_layers_run_once_and_the_model_scores_with_the_whole_network(photo_frames):
    train, test = photo_frames
    clf = ImageClassifier(imageCol="content", numClasses=2, epochs=2, batchSize=8, freezeUntil="_blocks.14",
                          augmentation="[]", showProgress=False, seed=3)
    model = clf.fit(train)
    est = clf.last_estimator
    assert est.getInputCol() == "content_frozen" and est.getOrDefault("inputShape") == [192, 7, 7]  # the cached path
    assert len(model.training_summary) == 2
    out = model.transform(test).toPandas()  # images in: the whole network, the trained layers loaded
    assert float((out["prediction"] == out["label"]).mean()) >= 0.85
    assert ImageClassifier(freezeUntil="_blocks.14", numClasses=2)._frozen_network() is None  # augmentation on


def small_images(spark, n=48, size=40, seed=0):
    rows = [(array_to_struct(img, f"i{i}"), label) for i, (img, label) in enumerate(crops(n // 2, size, seed, False))]
    return spark.createDataFrame(rows, "image " + IMAGE_STRUCT.simpleString() + ", label int").repartition(2)


def small_estimator(**kw):
    base = dict(network="small_cnn", inputCol="image", imagePreprocessing="small_cnn_cifar", epochs=2,
                batchSize=8, numWorkers=2, learningRate=3e-3, showProgress=False, seed=11, shuffleBuffer=8,
                augmentation=json.dumps([{"op": "random_resized_crop", "scale": [0.5, 1.0]},
                                         {"op": "flip", "p": 0.5}, {"op": "grey", "p": 0.2}]))
    return TorchEstimator(**{**base, **kw})


def test_one_seed_reproduces_an_augmented_streamed_run_exactly(spark):
    """Also with the rows made in feeding processes (irbis.kernels.feed) on the executors: the same batches."""
    df = small_images(spark)
    first, second = small_estimator().fit(df), small_estimator(feedProcesses="2").fit(df)
    other = small_estimator(seed=12).fit(df)
    losses = [r["loss"] for r in first.training_summary]
    assert losses == [r["loss"] for r in second.training_summary]
    assert losses != [r["loss"] for r in other.training_summary]
    a = np.stack([v.toArray() for v in first.transform(df).toPandas()["prediction"]])
    b = np.stack([v.toArray() for v in second.transform(df).toPandas()["prediction"]])
    assert np.array_equal(a, b)


def test_a_network_trained_on_images_is_a_torch_model_that_reads_images_as_trained(spark, tmp_path):
    """TorchEstimator's one Model class, whatever the rows: trained on images with imagePreprocessing it is a
    TorchModel carrying that value, which decodes and preprocesses structs and files as the training did; a
    file it cannot read gets a null output and its reason in errorCol, and the value survives save/load."""
    from irbis.kernels.image.network_input import preprocess_images
    from irbis.kernels.inference import make_torch_predict_fn, resolve_source
    from irbis.ml import TorchModel
    from irbis.models import preprocessing_for

    df = small_images(spark, n=8).coalesce(1)
    model = small_estimator(epochs=1, numWorkers=1, augmentation="[]").fit(df)
    assert type(model) is TorchModel and model.getImagePreprocessing() == "small_cnn_cifar"
    assert model.getInputCol() == "image" and model.getOutputCol() == "prediction"
    bgr = [img for img, _ in crops(4, 40, 0, False)]
    batch, valid, _ = preprocess_images([array_to_struct(b) for b in bgr], preprocessing_for("small_cnn_cifar"))
    expected = make_torch_predict_fn(resolve_source(model.getNetwork()))(batch)
    files = [cv2.imencode(".png", b)[1].tobytes() for b in bgr] + [b"\x89PNG not an image"]
    frame = spark.createDataFrame([(f,) for f in files], "image binary").coalesce(1)
    model.save(str(tmp_path / "scorer"))  # a fresh folder: no overwrite(), which Spark Connect refuses
    again = TorchModel.load(str(tmp_path / "scorer")).setErrorCol("error")
    assert again.getImagePreprocessing() == "small_cnn_cifar"
    out = again.transform(frame).toPandas()
    np.testing.assert_allclose(np.stack([v.toArray() for v in out["prediction"][:8]]), expected, rtol=1e-4, atol=1e-5)
    assert out["prediction"][8] is None and out["error"][8] and out["error"][:8].isna().all()
    with pytest.raises(TypeError, match="column 'label'.*with imagePreprocessing it must hold images"):
        again.setInputCol("label").transform(df)


def test_auto_batch_size_searches_on_images_read_a_batch_at_a_time(spark):
    """Images are spilled and decoded per batch: batchSize="auto" trains its trials and judges them on a
    sample read the same way, and the epoch's record says what it tried."""
    model = small_estimator(batchSize="auto", autoBatchSizes="[1, 2, 4]", epochs=1, augmentation="[]",
                            optimizer="momentum", lrScaling="linear").fit(small_images(spark, n=96))
    record = model.training_summary[0]
    assert set(record["batchTrials"]) >= {"start", "1", "2"}, record["batchTrials"]
    assert record["batchSize"] in (1, 2, 4) and record["trialSamples"] > 0
    assert all(np.isfinite(v) for v in record["batchTrials"].values())


def test_class_weights_early_stopping_and_validation_metrics(spark):
    df = small_images(spark, n=64)
    model = small_estimator(epochs=6, validationFraction=0.25, earlyStoppingPatience=1, classWeights="balanced",
                            optimizer="sgd", learningRate=2.0, augmentation="[]",
                            networkOptions='{"num_classes": 2}').fit(df)
    summary = model.training_summary
    losses = [r["validationLoss"] for r in summary]
    best = int(np.argmin(losses)) + 1
    assert len(summary) == min(6, best + 1)  # stopped one epoch after the best, or ran out of epochs
    if len(summary) < 6:
        assert summary[-1]["restoredEpoch"] == best
    assert all(0.0 <= r["auc"] <= 1.0 for r in summary)
    with pytest.raises(ValueError, match="classWeights has 3 weights but the network outputs 2 classes"):
        small_estimator(classWeights="[1, 2, 3]", epochs=1, networkOptions='{"num_classes": 2}').fit(df)
    with pytest.raises(ParamValueError, match="classWeights"):
        small_estimator(classWeights="heavy")


def test_corrupt_files_follow_nan_policy(spark, photo_frames):
    train, _ = photo_frames
    bad = spark.createDataFrame([(b"\xff\xd8 truncated", 0), (b"", 1)], "content binary, label int")
    df = train.union(bad).repartition(2)
    est = TorchEstimator(network="small_cnn", inputCol="content", imagePreprocessing="small_cnn_cifar", epochs=1,
                         batchSize=8, numWorkers=2, showProgress=False)
    with pytest.raises(ValueError, match=r"2 images of inputCol 'content' cannot be read \(the first: row \d+ "
                                         r"of training task \d's partition\).*nanPolicy='skip'"):
        est.fit(df)
    model = est.setNanPolicy("skip").fit(df)
    assert model.training_summary[-1]["skippedRows"] == 2


def test_a_file_read_images_could_not_decode_follows_nan_policy(spark, tmp_path):
    """read_images gives a null image and a reason for a corrupt file; nanPolicy='skip' trains without it and
    counts it, 'error' names it as an image that cannot be read."""
    from pyspark.sql import functions as F

    from irbis.spark.images import read_images

    for i, (jpeg, label) in enumerate(crops(4, 40, 7)):
        (tmp_path / f"{label}_{i}.jpg").write_bytes(jpeg)
    (tmp_path / "1_broken.jpg").write_bytes(b"\xff\xd8 truncated")
    name = F.element_at(F.split("path", "/"), -1)
    images = read_images(str(tmp_path), spark=spark).withColumn("label", name.substr(1, 1).cast("int"))
    assert images.where("image is null and error is not null").count() == 1
    est = TorchEstimator(network="small_cnn", inputCol="image", imagePreprocessing="small_cnn_cifar", epochs=1,
                         batchSize=4, numWorkers=2, showProgress=False)
    with pytest.raises(ValueError, match=r"1 images of inputCol 'image' cannot be read.*nanPolicy='skip'"):
        est.fit(images)
    assert est.setNanPolicy("skip").fit(images).training_summary[-1]["skippedRows"] == 1


def test_bad_image_input_is_named_before_any_step(spark, photo_frames):
    train, _ = photo_frames
    with pytest.raises(ValueError, match=r"labelCol 'label' holds labels from 1 to 2, outside \[0, numClasses=2\)"):
        ImageClassifier(imageCol="content", numClasses=2, epochs=1).fit(
            train.selectExpr("content", "label + 1 as label"))
    vectors = spark.createDataFrame([(Vectors.dense([1.0, 2.0]), 0)] * 4, ["vec", "label"])
    with pytest.raises(ParamValueError, match="imagePreprocessing.*holds numbers, not images"):
        TorchEstimator(network="small_cnn", inputCol="vec", imagePreprocessing="small_cnn_cifar").fit(vectors)
    mixed = spark.createDataFrame([(array_to_struct(np.zeros((s, s, 3), np.uint8)), 0) for s in (8, 8, 9, 9)],
                                  "image " + IMAGE_STRUCT.simpleString() + ", label int")
    with pytest.raises(ValueError, match="images of different sizes .* no preprocessing resizes them"):
        TorchEstimator(network="small_cnn", inputCol="image", inputShape=[3, 8, 8], numWorkers=2,
                       showProgress=False).fit(mixed)
    with pytest.raises(ValueError, match="set imagePreprocessing .* or inputShape"):
        TorchEstimator(network="small_cnn", inputCol="image", showProgress=False).fit(mixed)
    with pytest.raises(ParamValueError, match="backbone='no_such_net'"):
        ImageClassifier(backbone="no_such_net")
    with pytest.raises(ValueError, match="freezeUntil '_blocks.99' names no layer of EfficientNetLite0"):
        ImageClassifier(imageCol="content", numClasses=2, freezeUntil="_blocks.99").fit(train)
    with pytest.raises(ParamValueError, match="augmentation"):
        TorchEstimator(augmentation='[{"op": "spin"}]')


def test_image_structs_and_file_bytes_train_alike(spark):
    """The same photographs as Spark image structs and as PNG bytes give the same network inputs, so one seed
    gives the same first step from either column: one batch of every row, its loss a mean that the rows'
    order cannot change (the ranks deal rows by their content, which differs between the two columns, so
    a later step's batches would differ; augmentation, drawn per row in that order, is off)."""
    rows = crops(12, 40, 5, jpeg=False)
    structs = spark.createDataFrame([(array_to_struct(img), label) for img, label in rows],
                                    "image " + IMAGE_STRUCT.simpleString() + ", label int").coalesce(1)
    files = spark.createDataFrame([(cv2.imencode(".png", img)[1].tobytes(), label) for img, label in rows],
                                  "image binary, label int").coalesce(1)
    one_step = dict(numWorkers=1, epochs=1, batchSize=len(rows), shuffleBuffer=len(rows), augmentation="[]")
    a = small_estimator(**one_step).fit(structs).training_summary
    b = small_estimator(**one_step).fit(files).training_summary
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-5)


@pytest.mark.gpu
def test_fine_tuning_on_the_gpu_runs_bf16_channels_last_and_learns(photo_frames):
    """device="cuda": decoding and augmentation on the CPU threads, the step in bf16 autocast on channels-last
    batches through pinned memory; it learns as on the CPU. One worker: NCCL refuses two ranks on one GPU.

    Skipped without a GPU; its path on the CPU: the fit of these photographs in fp32 (its first blocks frozen),
    ``test_fine_tuning_a_pretrained_network_on_photographs_beats_chance`` above; the loop's image path
    (channels-last batches decoded on the CPU threads),
    ``test_image_training_on_the_device_takes_its_image_path_and_learns`` in
    ``tests/unit/train/test_device_training.py``; the choice of bf16 autocast for the GPU's image path,
    ``test_training_precision_sets_the_steps_autocast``, and steps under bf16 autocast,
    ``test_a_gru_learns_in_bf16_with_its_weights_and_exchange_in_fp32``, both in
    ``tests/unit/train/test_sequence_training.py``. No CPU test covers the pinned-memory copy or NCCL."""
    from irbis.train.loop import gpu_images

    train, test = photo_frames
    clf = ImageClassifier(imageCol="content", numClasses=2, epochs=2, batchSize=16, numWorkers=1, device="cuda",
                          showProgress=False, seed=3)
    model = clf.fit(train)
    assert gpu_images(clf.last_estimator.last_spec)
    out = model.transform(test).toPandas()
    assert float((out["prediction"] == out["label"]).mean()) >= 0.85
