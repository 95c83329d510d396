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
# # Asynchronous training with a parameter server
#
# `TorchEstimator` trains a PyTorch network on the Spark executors. With a synchronous strategy the
# workers wait for each other at every step; with a parameter-server strategy (`downpour`, `mixed`,
# `dcasgd`) they don't: each worker pushes its gradients to sharded servers and pulls fresh weights
# whenever it is ready. The price is *staleness*: an update computed on weights that other workers have
# already changed. `dcasgd` (delay-compensated ASGD) corrects each gradient for the weights' drift since
# the worker pulled them.
#
# This notebook trains a small MLP on scikit-learn's handwritten digits with `dcasgd` on two workers, and
# plots the loss and the staleness of the updates per epoch from the model's training summary.

# %%
import irbis

spark = irbis.get_spark("local[2]", app_name="parameter-server", **{"spark.driver.memory": "1g",
                                                                      "spark.ui.showConsoleProgress": "false"})
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## The data
#
# 1,797 8x8 images of digits, scaled to [0, 1]: a Spark DataFrame of `features` vectors and `label`
# integers, 80 % for training and 20 % held out.

# %%
from pyspark.ml.linalg import Vectors
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

x, y = load_digits(return_X_y=True)
x_train, x_test, y_train, y_test = train_test_split(x / 16, y, test_size=0.2, stratify=y, random_state=0)
train = spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(x_train, y_train)],
                              ["features", "label"]).repartition(2).cache()
test = spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(x_test, y_test)], ["features", "label"])
print(train.count(), "training rows,", test.count(), "test rows")

# %% [markdown]
# ## Train with `dcasgd`
#
# Each of the two workers hosts a shard of the parameter server. With N asynchronous workers every push
# is applied on its own, so the rate is about 1/N of what synchronous training would use. `lambda_` sets
# the strength of the delay compensation. The progress bar shows the loss as the epochs go.

# %%
estimator = irbis.TorchEstimator(network="mlp", networkOptions='{"in_features": 64, "hidden": 64, "out_features": 10}',
                                 strategy="dcasgd", strategyOptions='{"lambda_": 2.0}', numWorkers=2,
                                 optimizer="sgd", learningRate=0.1, epochs=8, batchSize=16,
                                 validationFraction=0.1, seed=0)
model = estimator.fit(train)

# %% [markdown]
# ## The training summary
#
# One record per epoch. Besides the losses and the accuracy on the validation rows, a parameter-server
# strategy records how the updates went: `psUpdates` counts the pushes (`applied`, `rejected`, `replayed`)
# and `staleness` describes how many versions behind the server each applied update was computed (mean,
# median `p50`, 90th percentile `p90`, `max`). In a notebook the summary shows as a table, nested values as
# dotted columns:

# %%
summary = model.training_summary
summary

# %% [markdown]
# ## Loss and staleness per epoch
#
# `summary.plot(key)` draws any column against the epoch (dotted names reach the nested values), on the
# matplotlib axes you give it.

# %%
import matplotlib.pyplot as plt

fig, (loss_ax, stale_ax) = plt.subplots(1, 2, figsize=(11, 4))
summary.plot("loss", ax=loss_ax)
for key in ("staleness.mean", "staleness.p90", "staleness.max"):
    summary.plot(key, ax=stale_ax, title="staleness of the applied updates (versions)")
for line, key in zip(stale_ax.get_lines(), ("mean", "p90", "max")):
    line.set_label(key)
stale_ax.legend()
stale_ax.set_ylabel("versions behind")
fig.tight_layout()

# %% [markdown]
# The last epoch's histogram: how many updates were 0, 1, 2, ... versions stale.

# %%
histogram = summary[-1]["staleness"]["histogram"]
last = max(i for i, n in enumerate(histogram) if n) + 1
fig, ax = plt.subplots(figsize=(6, 3))
ax.bar(range(last), histogram[:last])
ax.set_xlabel("staleness (versions)")
ax.set_ylabel("updates")
ax.set_title(f"epoch {summary[-1]['epoch']}: {summary[-1]['staleness']['updates']} updates");

# %% [markdown]
# ## Test accuracy
#
# The fitted model is a `TorchModel`: its `prediction` column holds the network's ten scores per row.

# %%
import numpy as np
from pyspark.ml.functions import vector_to_array

scored = model.transform(test).select("label", vector_to_array("prediction").alias("scores")).toPandas()
predicted = np.stack(scored["scores"]).argmax(axis=1)
print(f"test accuracy: {(predicted == scored['label']).mean():.3f} on {len(scored)} digits")

# %%
spark.stop()
