"""LIME's kernel: a block of rows explained inside the task that holds it, the perturbations of each row
scored through the explained model's own kernels (:class:`LIMEKernel`), and the explanation of a block of
each kind of input, whatever scores it (the model's kernels, or Spark jobs where a stage has none).

The stages that build it are in :mod:`irbis.ml.lime`; ``settings`` holds their Param values
(``LIMEParams._settings``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from irbis.explain.explanations import FeatureStats, check_num_samples, explain_image, explain_rows, explain_text
from irbis.explain.segment import superpixels
from irbis.kernels.blocks import Images, Prepared, Tensor
from irbis.kernels.chain import ChainKernel
from irbis.kernels.image.network_input import masked_inputs

__all__ = ["EXPLAINERS", "LIMEKernel", "explain_block", "explain_images", "explain_tensor", "explain_texts",
           "target_values"]


def target_values(block: Any, column: str) -> np.ndarray:
    """A target block (vectors or numbers, no nulls) as an (S, n) float array."""
    if isinstance(block, Tensor):
        if not block.valid.all():
            raise ValueError(f"the model gave a null {column!r} for a perturbed input")
        return np.asarray(block.values, np.float64).reshape(len(block.values), -1)
    values = np.asarray([np.nan if v is None else v for v in block], np.float64)
    return values.reshape(len(values), -1)


def explain_tensor(block: Any, score: Callable[[np.ndarray], np.ndarray], settings: dict[str, Any],
                   stats: FeatureStats | None) -> dict[str, Any]:
    """Explain the rows of a vector block; rows that are null or hold NaN get a reason instead.

    ``settings`` holds the stage's Param values (``LIMEParams._settings`` in :mod:`irbis.ml.lime`);
    ``stats``, the background data's, which perturbed rows are drawn from (a fitted TabularLIMEModel's).
    """
    col, err_col = settings["column"], settings["error"]
    if stats is None:
        raise ValueError("TabularLIMEModel: explaining rows needs the background data's statistics; fit "
                         "TabularLIME on data like the rows to explain")
    if not isinstance(block, Tensor) and all(v is None for v in block):  # a column of nulls only
        block = Tensor(np.zeros((0, len(stats.mean))), np.zeros(len(block), bool))
    if not isinstance(block, Tensor):
        raise TypeError(f"TabularLIMEModel: column {col!r} must hold vectors, found {type(block).__name__}")
    values = (block.values.reshape(len(block.values), -1).astype(np.float64) if len(block.values)
              else np.zeros((0, len(stats.mean))))
    if len(values) and values.shape[1] != len(stats.mean):
        raise ValueError(f"TabularLIMEModel: column {col!r} holds vectors of {values.shape[1]} values, but "
                         f"the background data had {len(stats.mean)}; fit on data like the rows to explain")
    finite = np.isfinite(values).all(axis=1)
    if not finite.all() and not err_col:
        raise ValueError(f"TabularLIMEModel: column {col!r} has a row with NaN or infinite values")
    weights, r2 = explain_rows(values[finite], score, stats, settings["targets"],
                               num_samples=settings["num_samples"], alpha=settings["alpha"],
                               seed=settings["seed"], batch_size=settings["batch_size"],
                               target_name=settings["target_col"])
    rows: list[Any] = [None] * len(block)
    fits: list[Any] = [None] * len(block)
    reasons: list[Any] = ["the row is null"] * len(block)
    valid_at = np.flatnonzero(block.valid)
    for k, i in enumerate(valid_at[finite]):
        rows[i], fits[i], reasons[i] = weights[k].tolist(), r2[k].tolist(), None
    for i in valid_at[~finite]:
        reasons[i] = "the row has NaN or infinite values"
    out = {settings["output"]: rows, settings["metrics"]: fits}
    return {**out, err_col: reasons} if err_col else out


def rows_block(batch: np.ndarray) -> Tensor:
    """Perturbed rows (S, D) as the vector block a model's first stage reads."""
    return Tensor(batch, np.ones(len(batch), bool))


def explain_texts(block: Any, score: Callable[[np.ndarray], np.ndarray], settings: dict[str, Any],
                  stats: FeatureStats | None = None) -> dict[str, Any]:
    """Explain each text of a string block; a null text (or one without words) gets a reason instead.
    Texts are perturbed by dropping words: ``stats`` (background statistics) play no part."""
    from irbis.kernels.text_encoder import decode_texts

    texts, errors = decode_texts(block, settings["column"], "TextLIME")
    weights: list[Any] = [None] * len(texts)
    fits: list[Any] = [None] * len(texts)
    words: list[Any] = [None] * len(texts)
    reasons: list[Any] = list(errors)
    for i, text in enumerate(texts):
        if text is None:
            continue
        try:
            found = explain_text(text, score, settings["targets"], num_samples=settings["num_samples"],
                                 fraction=settings["fraction"], alpha=settings["alpha"], seed=settings["seed"],
                                 batch_size=settings["batch_size"], target_name=settings["target_col"])
        except ValueError as err:
            if not settings["error"]:
                raise
            reasons[i] = str(err)
            continue
        weights[i], fits[i] = found.weights.tolist(), found.r2.tolist()
        words[i] = [text[a:b] for a, b in found.segments]  # type: ignore[union-attr]  # a text's spans
    if not settings["error"] and any(r and r != "null text" for r in reasons):
        raise ValueError(next(r for r in reasons if r and r != "null text"))
    out = {settings["output"]: weights, settings["metrics"]: fits}
    if settings["tokens"]:
        out[settings["tokens"]] = words
    return {**out, settings["error"]: reasons} if settings["error"] else out


def texts_block(batch: np.ndarray) -> np.ndarray:
    """Perturbed texts as the string block a model's first stage reads."""
    return np.asarray(batch, dtype=object)


def images_block(batch: Any) -> Any:
    """Perturbed images (or a network's masked inputs, :class:`Prepared`) as the block a model's first stage
    reads."""
    return batch if isinstance(batch, Prepared) else Images.from_arrays(list(batch))


def explain_images(block: Any, score: Callable[[np.ndarray], np.ndarray], settings: dict[str, Any],
                   stats: FeatureStats | None = None) -> dict[str, Any]:
    """Explain each image of a block; a null or unusable image gets a reason (or raises without errorCol).
    Images are perturbed by blacking out superpixels: ``stats`` (background statistics) play no part."""
    if not isinstance(block, Images) and all(v is None for v in block):  # a column of nulls only
        block = Images.from_arrays([None] * len(block))
    if not isinstance(block, Images):
        raise TypeError(f"ImageLIME: column {settings['column']!r} must hold images")
    n, names, err_col = settings["num_samples"], settings["names"], settings["error"]
    out: dict[str, list[Any]] = {name: [] for name in names}
    for i in range(len(block)):
        try:
            image = block.image(i)
            if image is None:
                raise ValueError("the image is null")
            segments = superpixels(image, settings["cell"], settings["modifier"])
            check_num_samples(n, int(segments.max()) + 1, "superpixels of this image")
        except ValueError as err:
            if not err_col and block.valid[i]:
                raise ValueError(f"ImageLIME: column {settings['column']!r}: {err}") from err
            _append(out, names, [None] * (len(names) - 1) + [str(err) if err_col else None])
            continue
        inputs = None
        if settings["network_input"] is not None:  # mask the network's input, preprocessed once
            masked = masked_inputs(image, segments, settings["network_input"])
            inputs = lambda masks: Prepared(masked(masks))  # noqa: E731
        found = explain_image(image, score, settings["targets"], num_samples=n, segments=segments,
                              fraction=settings["fraction"], alpha=settings["alpha"], seed=settings["seed"],
                              batch_size=settings["batch_size"], target_name=settings["target_col"],
                              inputs=inputs)
        values = [found.weights.tolist(), found.r2.tolist()]
        values += [segments.reshape(-1)] if settings["superpixels"] else []
        _append(out, names, values + ([None] if err_col else []))
    return out


def _append(out: dict[str, list[Any]], names: list[str], values: list[Any]) -> None:
    for name, value in zip(names, values):
        out[name].append(value)


#: Each kind of input LIME explains: how a batch of perturbed inputs becomes the block a model's first stage
#: reads, and how a block of rows is explained.
EXPLAINERS: dict[str, tuple[Callable[[Any], Any], Callable[..., dict[str, Any]]]] = {
    "rows": (rows_block, explain_tensor),
    "texts": (texts_block, explain_texts),
    "images": (images_block, explain_images),
}


def explain_block(kind: str, block: Any, score: Callable[[Any], np.ndarray], settings: dict[str, Any],
                  stats: FeatureStats | None = None) -> dict[str, Any]:
    """The output blocks of a block of ``kind`` rows (``rows``, ``texts`` or ``images``) explained with
    ``score``, a batch of perturbed inputs to an ``(S, n)`` array of the target's values; ``stats`` (the
    background data's) for rows."""
    return EXPLAINERS[kind][1](block, score, settings, stats)


@dataclass(frozen=True)
class LIMEKernel:
    """A LIME stage's kernel as a plain value: the explained model's kernels (``model``, from the input
    column to the target column), the kind of input, the Param values and, for rows, the background
    statistics. Called on a dict of blocks, it gives the explanation's blocks. :attr:`files` are the model's
    (a fitted network's), which :meth:`relocated` rewrites."""

    kind: str
    model: ChainKernel
    settings: dict[str, Any]
    stats: FeatureStats | None = None

    @property
    def files(self) -> tuple[str, ...]:
        """The local files the explained model's kernels read."""
        return self.model.files

    def relocated(self, paths: dict[str, str]) -> LIMEKernel:
        """This kernel with the model reading its files at ``paths``."""
        return replace(self, model=self.model.relocated(paths))

    def score(self, batch: Any) -> np.ndarray:
        """The target's values, ``(S, n)``, of a batch of perturbed inputs, through the model's kernels."""
        to_block, target = EXPLAINERS[self.kind][0], self.settings["target_col"]
        return target_values(self.model({self.settings["column"]: to_block(batch)})[target], target)

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        return explain_block(self.kind, blocks[self.settings["column"]], self.score, self.settings, self.stats)
