"""A training job for spark-submit or a SparkApplication: digits as a DataFrame, a sync fit on two
workers, the model saved to cluster storage (pass its URL as the first argument)."""
import sys

from pyspark.ml.linalg import Vectors
from sklearn.datasets import load_digits

import irbis

spark = irbis.get_spark()  # under spark-submit: the master and settings it was given
x, y = load_digits(return_X_y=True)
df = spark.createDataFrame([(Vectors.dense(a / 16), int(b)) for a, b in zip(x, y)], ["features", "label"])
model = irbis.TorchEstimator(network="mlp", networkOptions='{"in_features": 64, "hidden": 128, "out_features": 10}',
                             numWorkers=2, epochs=10, showProgress=False).fit(df.repartition(2))
model.write().overwrite().save(sys.argv[1] if len(sys.argv) > 1 else "model")
print(model.training_summary[-1])
