"""The rungs of the text ladder on the drug reviews: drug-grouped folds, grouped CV, fitting and scoring.

The task is the reviews' sentiment as a binary label: ``positive`` (a rating of 7 to 10, the package's
cut) against the rest (neutral and negative). It is fixed before any fit; only the rungs' settings are
chosen, by cross-validation on the training reviews grouped by drug: a drug's reviews share one fold, so
a fold's validation reviews name drugs (and the side effects and wording that come with them) its
training part never saw. The test reviews never enter a choice: :func:`climb` reads them only to score
the setting that the training reviews chose.

==============  ========================================================================================
majority        every test review gets the training reviews' majority class (the floor to beat)
TF-IDF+LR       :class:`irbis.ml.TextFeaturizer` (hashed TF-IDF, fitted inside each fold) + Spark's
                ``LogisticRegression``; regParam by grouped CV
MiniLM+LR       frozen sentence embeddings (:class:`irbis.ml.TextEmbedder`, the catalogue's
                ``all_minilm_l6_v2``, 384-d) + ``LogisticRegression``; regParam by grouped CV
LSTM            a recurrent network trained from scratch (the :data:`LSTM` architecture) on the encoder's
                WordPiece ids (:class:`irbis.ml.TextTokenizer`) by :class:`irbis.ml.TorchEstimator`; epochs by CV
MiniLM-tuned    ``all_minilm_l6_v2`` fine-tuned with a new head (``TextClassifier``); epochs by CV
==============  ========================================================================================

Each rung is a :class:`Rung`: its grid (simplest setting first: CV keeps the first of equal scores), the
stateless stages it needs on every review (embedding, tokenizing: run once), and ``fit(train, setting,
seed)``.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
from pyspark import inheritable_thread_target
from pyspark.ml import Pipeline
from pyspark.ml.classification import LogisticRegression
from pyspark.sql import DataFrame

from irbis.demo.ladder import positive_score
from irbis.demo.stats import accuracy

__all__ = ["ENCODER", "LSTM", "RUNGS", "Rung", "climb", "grouped_cv", "majority_scores"]

#: The sentence encoder of the frozen and fine-tuned rungs, and the tokenizer of the recurrent one.
ENCODER = "all_minilm_l6_v2"
#: Tokens per review (the longest reviews have about 450; the encoder was trained on 256).
MAX_LENGTH = 256
#: The recurrent rung's architecture (:data:`irbis.models.ARCHITECTURES`): it reads packed token ids.
LSTM = "lstm_classifier"
#: Logistic regressions' regParam grid, the strongest (simplest model) first.
REG_GRID = (1.0, 0.1, 0.01, 0.001)


@dataclass(frozen=True)
class Rung:
    """One rung: ``fit(train, setting, seed)`` returns a model whose ``transform`` of the rows gives
    ``probability`` or two-logit ``logits``; ``grid`` holds the settings CV picks from, simplest first;
    ``stages()`` the stateless stages that add the column the rung reads to every review, run once."""

    name: str
    description: str
    grid: tuple[dict[str, Any], ...]
    fit: Callable[[DataFrame, dict[str, Any], int], Any]
    stages: Callable[[], list[Any]] = field(default=lambda: [])


def _lr(features: str, setting: dict[str, Any]) -> LogisticRegression:
    """Spark's logistic regression with the setting's ``regParam`` (and ``maxIter``, 100 by default)."""
    return LogisticRegression(featuresCol=features, labelCol="y", probabilityCol="probability",
                              rawPredictionCol="raw_prediction", regParam=setting["regParam"],
                              maxIter=setting.get("maxIter", 100))


def fit_tfidf(train: DataFrame, setting: dict[str, Any], seed: int) -> Any:
    """TF-IDF (fitted on ``train`` alone: its document frequencies too) + logistic regression."""
    from irbis.ml.text import TextFeaturizer

    featurizer = TextFeaturizer(inputCol="review", outputCol="tfidf", numFeatures=1 << 16)
    return Pipeline(stages=[featurizer, _lr("tfidf", setting)]).fit(train)


def fit_embedding_lr(train: DataFrame, setting: dict[str, Any], seed: int) -> Any:
    """Logistic regression on the frozen sentence embeddings (the ``embedding`` column)."""
    return _lr("embedding", setting).fit(train)


def embedding_stages() -> list[Any]:
    """The stage that adds ``embedding``: the encoder's 384-d sentence embedding of each review."""
    from irbis.ml.text_network import TextEmbedder

    return [TextEmbedder(network=ENCODER, inputCol="review", outputCol="embedding", maxLength=MAX_LENGTH)]


def token_stages() -> list[Any]:
    """The stage that adds ``ids``: each review's WordPiece ids (the encoder's tokenizer), array<int>."""
    from irbis.ml.text_network import TextTokenizer

    return [TextTokenizer(network=ENCODER, inputCol="review", outputCol="ids", maxLength=MAX_LENGTH)]


def _vocabulary() -> int:
    """Rows of the LSTM's embedding table: the size of the encoder's WordPiece vocabulary."""
    from irbis.models.text_networks import text_card, text_folder

    return int(json.loads((text_folder(text_card(ENCODER)) / "config.json").read_text())["vocab_size"])


def fit_lstm(train: DataFrame, setting: dict[str, Any], seed: int) -> Any:
    """The catalogue's :data:`LSTM` architecture (token ids -> embedding -> LSTM -> its last hidden state ->
    two logits; it reads a ``PackedSequence``, so padding never reaches the hidden state) trained from
    scratch on the ``ids`` by TorchEstimator (two data-parallel Spark tasks, Adam, batches of reviews of
    similar length): a TorchModel writing two-logit ``logits``."""
    from irbis.ml.estimator import TorchEstimator

    options = {"vocab_size": _vocabulary(), "num_classes": 2, "embed": 64, "hidden": 64, "seed": seed}
    est = TorchEstimator(network=LSTM, networkOptions=json.dumps(options), inputCol="ids", labelCol="y",
                         predictionCol="logits", epochs=setting["epochs"], batchSize=16, learningRate=2e-3,
                         numWorkers=2, seed=seed, showProgress=False)
    return est.fit(train.select("ids", train["y"].cast("int").alias("y")))


def fit_fine_tuned(train: DataFrame, setting: dict[str, Any], seed: int) -> Any:
    """The encoder fine-tuned with a new two-class head by ``TextClassifier``: a TextClassifierModel
    writing ``probability``."""
    from irbis.ml.text_classifier import TextClassifier

    clf = TextClassifier(backbone=ENCODER, inputCol="review", labelCol="y", numClasses=2,
                         epochs=setting["epochs"], batchSize=16, maxLength=MAX_LENGTH, numWorkers=2, seed=seed,
                         showProgress=False)
    return clf.fit(train.select("review", train["y"].cast("int").alias("y")))


#: The rungs in the order the ladder climbs them (the majority class is the floor below them).
RUNGS: dict[str, Rung] = {r.name: r for r in (
    Rung("TF-IDF+LR", "hashed TF-IDF of the words (fitted inside each fold) + logistic regression",
         tuple({"regParam": reg} for reg in REG_GRID), fit_tfidf),
    Rung("MiniLM+LR", f"frozen sentence embeddings ({ENCODER}, 384-d, TextEmbedder) + logistic regression",
         tuple({"regParam": reg} for reg in REG_GRID), fit_embedding_lr, embedding_stages),
    Rung("LSTM", f"an LSTM ({LSTM}: 64-d embedding, 64 units) trained from scratch on {ENCODER}'s WordPiece "
         "ids by TorchEstimator", ({"epochs": 4}, {"epochs": 8}), fit_lstm, token_stages),
    Rung("MiniLM-tuned", f"{ENCODER} fine-tuned with a new head (TextClassifier, 16 reviews a worker and step, "
         f"maxLength {MAX_LENGTH})", ({"epochs": 1}, {"epochs": 3}), fit_fine_tuned),
)}


def scores(model: Any, rows: DataFrame) -> pd.DataFrame:
    """Each row's ``id``, ``y`` and ``score`` (the probability of ``positive``), in ``id`` order."""
    scored = cast(pd.DataFrame, positive_score(model, rows).select("id", "y", "score").toPandas())
    return scored.sort_values("id", ignore_index=True)


def grouped_cv(train: Any, grid: Sequence[dict[str, Any]], folds: int,
               fit_score: Callable[[Any, Any, dict[str, Any]], tuple[np.ndarray, np.ndarray]],
               on_fit: Callable[[], None] | None = None, parallelism: int = 2) -> tuple[dict[str, Any], list[float]]:
    """The setting of ``grid`` with the best out-of-fold accuracy on ``train``, and each setting's.

    ``train`` is a Spark or pandas frame with a ``fold`` column (0 .. folds-1; whole groups per fold);
    ``fit_score(fit_rows, held_rows, setting)`` fits on the first and returns the labels and scores of
    the second. Every fold's held-out rows are scored once per setting and pooled; of equal accuracies
    the first setting wins (the grids list the simplest first). ``parallelism`` fits run at once (each
    Spark fit of a few hundred rows waits on its jobs more than it computes); ``on_fit`` is called
    after each. There is no test frame here to leak: the caller hands over the training rows alone.
    """
    def one(task: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        setting, k = grid[task[0]], task[1]
        out = fit_score(train[train["fold"] != k], train[train["fold"] == k], setting)
        if on_fit is not None:
            on_fit()
        return out

    tasks = [(i, k) for i in range(len(grid)) for k in range(folds)]
    with ThreadPoolExecutor(max(1, parallelism)) as pool:
        results = list(pool.map(one, tasks))
    table = []
    for i in range(len(grid)):
        held = [results[j] for j, (s, _) in enumerate(tasks) if s == i]
        table.append(accuracy(np.concatenate([y for y, _ in held]), np.concatenate([s for _, s in held])))
    return dict(grid[int(np.argmax(table))]), table


def climb(rung: Rung, train: DataFrame, test: DataFrame, folds: int, seed: int = 0,
          on_fit: Callable[[], None] | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Choose ``rung``'s setting by grouped CV on ``train``, refit it on all of ``train``, score ``test``.

    Returns the test scores (``id``, ``y``, ``score``) and what was chosen: the setting and the
    out-of-fold accuracy of each setting of the grid. A grid of one setting is fitted without CV.
    """
    @inheritable_thread_target(train.sparkSession)  # CV's threads run their jobs in the caller's job group
    def fit_score(fit_rows: DataFrame, held: DataFrame, setting: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        out = scores(rung.fit(fit_rows, setting, seed), held)
        return out["y"].to_numpy(), out["score"].to_numpy()

    chosen: dict[str, Any] = {}
    best = dict(rung.grid[0])
    if len(rung.grid) > 1:
        best, table = grouped_cv(train, rung.grid, folds, fit_score, on_fit)
        chosen["cv_accuracy"] = {_label(s): round(a, 4) for s, a in zip(rung.grid, table)}
    model = rung.fit(train, best, seed)
    if on_fit is not None:
        on_fit()
    return scores(model, test), {"setting": best, **chosen}


def _label(setting: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def majority_scores(train_y: np.ndarray, test: pd.DataFrame) -> pd.DataFrame:
    """The floor: every test row (``id``, ``y``) scored as the training rows' majority class."""
    majority = float(np.mean(train_y) >= 0.5)
    return test[["id", "y"]].assign(score=majority).sort_values("id", ignore_index=True)
