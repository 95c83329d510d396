"""Fixtures shared by the Spark training tests: scikit-learn's digits, split once, as a DataFrame."""
from __future__ import annotations

import pytest
from pyspark.ml.linalg import Vectors
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


@pytest.fixture(scope="module")
def digits():
    """Digits scaled to [0, 1]: x_train, x_test, y_train, y_test (stratified, 20% test)."""
    x, y = load_digits(return_X_y=True)
    return train_test_split(x / 16, y, test_size=0.2, stratify=y, random_state=0)


@pytest.fixture(scope="module")
def train_df(spark, digits):
    """The training digits as a cached DataFrame of (features vector, label int), two partitions."""
    xtr, _, ytr, _ = digits
    df = spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(xtr, ytr)], ["features", "label"])
    return df.repartition(2).cache()
