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
# # Serving a fitted pipeline over HTTP
#
# A fitted Spark ML `PipelineModel` saved to a folder can be served by Irbis's HTTP server: requests
# are answered by the stages' own batch kernels, in the server's process, without a Spark job per
# request (and, for the SparkML stages Irbis knows, without a JVM at all). This notebook fits and saves a
# small pipeline, starts the server on this machine, calls it over HTTP, checks its answers against
# Spark's, and stops it.

# %%
import irbis

spark = irbis.get_spark("local[2]", app_name="serving", **{"spark.driver.memory": "1g",
                                                             "spark.ui.showConsoleProgress": "false"})
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## Fit and save a pipeline
#
# scikit-learn's iris flowers: four measurements per flower, three species. The pipeline assembles the
# measurements into a vector, standardises it and fits a logistic regression.

# %%
from pyspark.ml import Pipeline
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.feature import StandardScaler, VectorAssembler
from sklearn.datasets import load_iris

iris = load_iris(as_frame=True)
columns = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
frame = iris.frame.set_axis(columns + ["label"], axis=1)
flowers = spark.createDataFrame(frame)

pipeline = Pipeline(stages=[VectorAssembler(inputCols=columns, outputCol="raw"),
                            StandardScaler(inputCol="raw", outputCol="features"),
                            LogisticRegression(featuresCol="features", labelCol="label", regParam=0.05)])
model = pipeline.fit(flowers)
model.write().overwrite().save("iris-model")

# %% [markdown]
# ## Start the server
#
# From a terminal you would run `irbis serve iris-model --port 8080`. Here we start the same server on a
# thread of this notebook's process: `build_app` loads the saved folder and `BackgroundServer` runs it on
# 127.0.0.1, on a free port (port 0 lets the system choose).

# %%
from irbis.serving.server import BackgroundServer, build_app

server = BackgroundServer(build_app("iris-model"), host="127.0.0.1", port=0)
url = server.start()
print("serving on", url)

# %% [markdown]
# ## Call it
#
# `POST /predict` takes a JSON object (one row) or a list of them, keyed by the pipeline's input
# columns, and answers with the last stage's output columns: here the classifier's `rawPrediction`,
# `probability` and `prediction`. The first answer as it comes, then all five beside their rows:

# %%
import json
import urllib.request


def call(path, payload=None):
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


rows = frame[columns].sample(5, random_state=0)
answers = call("/predict", rows.to_dict(orient="records"))
print(json.dumps(answers[0]))
rows.assign(species=[iris.target_names[int(a["prediction"])] for a in answers],
            probability=[[round(p, 3) for p in a["probability"]] for a in answers])

# %% [markdown]
# The answers are Spark's: the same rows through `model.transform` on Spark give the same predictions and
# probabilities.

# %%
import numpy as np

expected = model.transform(spark.createDataFrame(rows)).select("prediction", "probability").collect()
same = (all(a["prediction"] == e.prediction for a, e in zip(answers, expected))
        and np.allclose([a["probability"] for a in answers], [e.probability.toArray() for e in expected], atol=1e-9))
print("HTTP answers equal Spark's:", same)

# %% [markdown]
# The server also describes itself: `/health`, `/ready`, `/metrics` (Prometheus) and `/openapi.json`.

# %%
print(json.dumps(call("/health"), indent=1))

# %% [markdown]
# ## Stop
#
# `stop()` lets the requests in flight finish, then closes the server; then stop Spark.

# %%
server.stop()
spark.stop()
