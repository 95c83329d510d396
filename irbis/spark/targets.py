"""Training labels from annotators' votes: one column of vote counts, read four ways.

When several annotators label each row (the FER+ emotion data of Barsoum et al. 2016, ten taggers per
face, eight emotions), the votes per class can be read as

* ``"majority"``: the class with the most votes (the first on a tie), a class index for
  ``loss="cross_entropy"``;
* ``"soft"``: the votes' distribution ``v / sum(v)``, for ``loss="soft_cross_entropy"``, whose
  cross-entropy against that distribution is the "probabilistic" reading;
* ``"multi_label"``: 1 for every class with at least ``min_votes`` votes, else 0, for ``loss="bce"``
  (the network then predicts every class enough annotators saw).

(The fourth reading, drawing a label from the distribution each epoch, is in expectation the soft one.)
The conversions are Spark SQL expressions over the array: no Python runs per row, and they work on a
Spark Connect session.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from irbis.spark.columns import column

#: The readings of a column of votes that :func:`vote_labels` makes, and the loss each one trains.
VOTE_READINGS = {"majority": "cross_entropy", "soft": "soft_cross_entropy", "multi_label": "bce"}


def vote_labels(votes: str | Column, reading: str, min_votes: float = 1.0) -> Column:
    """A label column from a column of vote counts per class (an array of numbers).

    Parameters
    ----------
    votes : str or Column
        The votes per class of each row (``array<int>``, ``array<double>``...).
    reading : str
        ``"majority"`` (a class index, int), ``"soft"`` (``array<float>`` summing to 1) or ``"multi_label"``
        (``array<float>`` of 0/1); see :data:`VOTE_READINGS` for the loss each trains.
    min_votes : float
        ``"multi_label"``: the votes a class needs to count as present.

    Returns
    -------
    Column
        The label, for ``TorchEstimator(labelCol=...)``. A row with no votes gets a null label (``"soft"``,
        ``"majority"``), which the estimator names or skips under ``nanPolicy``.

    Examples
    --------
    .. code-block:: python

        df = df.withColumn("label", vote_labels("votes", "multi_label", min_votes=2))
        TorchEstimator(network=..., inputCol="features", labelCol="label", loss="bce").fit(df)
    """
    if reading not in VOTE_READINGS:
        raise ValueError(f"reading must be one of {list(VOTE_READINGS)}, found {reading!r}")
    v = column(votes) if isinstance(votes, str) else votes
    values = F.transform(v, lambda x: x.cast("double"))
    if reading == "majority":
        top = F.array_max(values)
        return F.when(top > 0, F.array_position(values, top).cast("int") - 1)
    if reading == "multi_label":
        return F.transform(values, lambda x: F.when(x >= float(min_votes), 1.0).otherwise(0.0)).cast("array<float>")
    total = F.aggregate(values, F.lit(0.0), lambda acc, x: acc + x)
    return F.when(total > 0, F.transform(values, lambda x: x / total)).cast("array<float>")


__all__ = ["VOTE_READINGS", "vote_labels"]
