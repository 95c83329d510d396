"""Fitted SparkML stages as pure batch kernels, with SparkML's numerics.

* :mod:`~irbis.kernels.sparkml.state`: a fitted stage's Params and data as plain values, read from its folder;
* :mod:`~irbis.kernels.sparkml.features`: the feature stages (scalers, indexers, encoders, imputer);
* :mod:`~irbis.kernels.sparkml.predictors`: the linear and neural predictors, and the adapter of every predictor;
* :mod:`~irbis.kernels.sparkml.trees`: decision trees, random forests and gradient-boosted trees;
* :mod:`~irbis.kernels.sparkml.stage_kernels`: :data:`~irbis.kernels.sparkml.stage_kernels.SPARKML_KERNELS`, the one
  registry from a stage's class name to its kernel, and the loaders over it.

Pure: no pyspark.
"""
