"""Kernels of SparkML's decision trees, random forests and gradient-boosted trees.

A saved tree model's ``data/`` table holds one row per node (per ``treeID`` in an ensemble): its
split (feature, threshold or left categories), its children, its prediction and impurity statistics
(class counts for a classifier). :class:`Tree` walks a batch of rows down a tree with one numpy step
per level. A row goes left when its feature is ``<= threshold`` (a continuous split; NaN goes right)
or is one of the left categories (a categorical split), as SparkML decides. Pure: no pyspark.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from irbis.kernels.chain import StageKernel
from irbis.kernels.sparkml.predictors import Scores, classifier_kernel, regressor_kernel, threshold_prediction
from irbis.kernels.sparkml.state import StageState

__all__ = ["Tree", "tree_classifier", "tree_regressor"]


class Tree:
    """One fitted tree from its node rows (dicts with SparkML's node fields)."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        nodes = sorted(nodes, key=lambda n: n["id"])
        if [n["id"] for n in nodes] != list(range(len(nodes))):
            raise ValueError("a saved tree's node ids must be 0 .. n-1")
        self.left = np.array([n["leftChild"] for n in nodes], np.int64)
        self.right = np.array([n["rightChild"] for n in nodes], np.int64)
        self.feature = np.array([max(n["split"]["featureIndex"], 0) for n in nodes], np.int64)
        self.threshold = np.array([(n["split"]["leftCategoriesOrThreshold"] or [np.nan])[0]
                                   if n["split"]["numCategories"] < 0 else np.nan for n in nodes])
        self.categories = {i: np.asarray(n["split"]["leftCategoriesOrThreshold"], np.float64)
                           for i, n in enumerate(nodes)
                           if n["leftChild"] >= 0 and n["split"]["numCategories"] >= 0}
        self.prediction = np.array([n["prediction"] for n in nodes], np.float64)
        width = max(len(n["impurityStats"]) for n in nodes)
        self.stats = np.array([list(n["impurityStats"]) + [0.0] * (width - len(n["impurityStats"]))
                               for n in nodes], np.float64)

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """The leaf each row of ``x`` (N, D) reaches."""
        node = np.zeros(len(x), np.int64)
        while True:
            rows = np.flatnonzero(self.left[node] >= 0)
            if not len(rows):
                return node
            at = node[rows]
            value = x[rows, self.feature[at]]
            with np.errstate(invalid="ignore"):
                left = value <= self.threshold[at]
            for i in set(self.categories) & set(at.tolist()):
                here = at == i
                left[here] = np.isin(value[here], self.categories[i])
            node[rows] = np.where(left, self.left[at], self.right[at])


def _trees(state: StageState) -> tuple[list[Tree], np.ndarray]:
    """The state's trees, in treeID order, and their weights (1 for a single tree)."""
    rows = state.tables["data"]
    if rows and "treeID" not in rows[0]:
        return [Tree(rows)], np.ones(1)
    nodes: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        nodes[row["treeID"]].append(row["nodeData"])
    weights = {r["_1"]: r["_3"] for r in state.tables.get("treesMetadata", [])}
    ids = sorted(nodes)
    return [Tree(nodes[i]) for i in ids], np.array([weights.get(i, 1.0) for i in ids], np.float64)


def _size(state: StageState) -> int | None:
    size = state.extra.get("numFeatures")
    return int(size) if size is not None else None


def _normalize(raw: np.ndarray) -> np.ndarray:
    total = raw.sum(axis=1, keepdims=True)
    return np.divide(raw, total, out=raw.copy(), where=total != 0)


def tree_classifier(state: StageState) -> StageKernel:
    """A decision tree, random forest or GBT classification model.

    A single tree's raw score is its leaf's class counts; a forest's, the sum of each tree's class
    frequencies at its leaf; both normalise to probabilities. A GBT model (binary, logistic loss) has
    the weighted sum ``m`` of its trees' predictions as margin: raw ``[-m, m]``, probability
    ``1 / (1 + exp(2m))`` of class 0.
    """
    trees, weights = _trees(state)
    thresholds = state.param("thresholds") or None
    boosted, forest = state.cls.startswith("GBT"), state.cls.startswith("RandomForest")
    classes = int(state.extra.get("numClasses", 2))

    def score(x: np.ndarray) -> Scores:
        if boosted:
            margin = sum(w * t.prediction[t.leaves(x)] for t, w in zip(trees, weights))
            p0 = 1.0 / (1.0 + np.exp(2.0 * margin))
            probability = np.stack([p0, 1.0 - p0], axis=1)
            raw = np.stack([-margin, margin], axis=1)
            return raw, probability, threshold_prediction(probability, thresholds)
        raw = np.zeros((len(x), classes))
        for tree in trees:
            counts = tree.stats[tree.leaves(x)][:, :classes]
            raw += _normalize(counts) if forest else counts
        probability = _normalize(raw.copy())
        return raw, probability, threshold_prediction(probability, thresholds)

    return classifier_kernel(state, _size(state), score)


def tree_regressor(state: StageState) -> StageKernel:
    """A decision tree (its leaf's value), random forest (the trees' mean) or GBT (their weighted sum)."""
    trees, weights = _trees(state)
    forest = state.cls.startswith("RandomForest")

    def predict(x: np.ndarray) -> np.ndarray:
        if forest:
            return sum(t.prediction[t.leaves(x)] for t in trees) / len(trees)
        return sum(w * t.prediction[t.leaves(x)] for t, w in zip(trees, weights))

    return regressor_kernel(state, _size(state), predict)
