"""LIME stages: ``ImageLIME`` (a Transformer) and ``TabularLIME`` (an Estimator) over any fitted model.

Each input row is explained inside the Spark task that holds it: its perturbations are scored in
mini-batches through the model's own batch kernels (:mod:`irbis.ml.lime_scoring`), so one Spark job
explains the whole DataFrame and the explanations run in parallel across tasks. The LIME math is pure
(:mod:`irbis.explain`). The Param names are SynapseML's (``targetCol``, ``targetClasses``,
``numSamples``, ``cellSize``, ``modifier``, ``samplingFraction``, ``regularization``, ``metricsCol``).

The explained ``model`` is not a Param (only JSON crosses the Params boundary): set it with the
constructor or ``setModel``; ``save`` writes it as a saved stage beside the metadata.
"""
from functools import partial
from typing import Any, Callable

import numpy as np
from pyspark.ml.param import TypeConverters
from pyspark.sql.types import ArrayType, DataType, IntegerType, StructType

from irbis.explain.lime import check_num_samples, explain_image
from irbis.explain.segment import superpixels
from irbis.kernels.blocks import Images, Prepared
from irbis.kernels.image.features import masked_inputs
from irbis.ml.base import IrbisTransformer
from irbis.ml.lime_base import LIMEParams
from irbis.ml.lime_tabular import TabularLIME, TabularLIMEModel
from irbis.ml.params import at_least, in_range, table_mixin

__all__ = ["ImageLIME", "TabularLIME", "TabularLIMEModel"]


def _images_block(batch: Any) -> Any:
    return batch if isinstance(batch, Prepared) else Images.from_arrays(list(batch))


def _network_input(model: Any, column: str) -> Any:
    """The preprocessing of the model's first stage when it is an image network reading ``column``
    (an :class:`~irbis.ml.image_network.ImageNetworkStage`: ImageFeaturizer, a fitted image classifier):
    LIME then masks its preprocessed input instead of preprocessing every masked image. None otherwise."""
    from irbis.ml.ensemble import EnsembleByKey
    from irbis.ml.image_network import ImageNetworkStage
    from irbis.ml.kernel_pipeline import flatten
    from irbis.ml.lime_scoring import scoring_chain

    stages = [s for s in flatten(model) if not isinstance(s, EnsembleByKey)]
    first = stages[0] if stages else None
    # Only when every stage runs in the task: a model scored by Spark jobs takes the images themselves.
    if isinstance(first, ImageNetworkStage) and first.getInputCol() == column and not scoring_chain(model).missing:
        return first._preprocessing()
    return None

_IMAGE_PARAMS: Any = table_mixin("HasImageLIMEParams", [
    ("cellSize", "side of a superpixel in pixels", TypeConverters.toFloat, 16.0, at_least(1)),
    ("modifier", "SLIC compactness on the 0-255 colour scale (larger: squarer superpixels)",
     TypeConverters.toFloat, 130.0, in_range(0, low_open=True)),
    ("samplingFraction", "probability that a superpixel is kept in a sample", TypeConverters.toFloat, 0.7,
     in_range(0, 1, low_open=True)),
    ("superpixelCol", "output column of superpixel labels (empty: none)", TypeConverters.toString, "superpixels"),
])


class ImageLIME(LIMEParams, _IMAGE_PARAMS, IrbisTransformer):
    """Explain a model's predictions on images: a weight per superpixel and target class (LIME).

    Each image is cut into superpixels (SLIC, about ``cellSize`` pixels a side); ``numSamples``
    copies with random superpixels blacked out (each kept with probability ``samplingFraction``) are
    scored through the model's batch kernels, ``miniBatchSize`` at a time, and a weighted ridge fit of
    ``targetCol[targetClasses]`` on the on/off masks gives each superpixel's weight.

    Parameters
    ----------
    model : Transformer or PipelineModel
        The fitted model; it must read ``inputCol`` (an image struct column) and write ``targetCol``.
        Irbis stages, ``LogisticRegressionModel`` and ``VectorAssembler`` run inside the task;
        ``EnsembleByKey`` is skipped (the identity for a single image). Other stages are run as a
        Spark job per batch of perturbations from the driver, with a warning.
    outputCol, metricsCol, superpixelCol, errorCol : str
        Weights (one list per target class), the fits' R², the superpixel labels (row-major, H·W
        values; empty for none), and the reason a row has no explanation (a null or too small image;
        empty to raise instead).

    Examples
    --------
    >>> lime = ImageLIME(model=pipeline, inputCol="image", targetCol="probability",
    ...                  targetClasses=[1], numSamples=500)            # doctest: +SKIP
    >>> lime.transform(images).select("path", "weights", "superpixels")  # doctest: +SKIP
    """

    _extras = ("images", "explain")

    _accepts = frozenset({"image"})

    _defaults = {"inputCol": "image", "outputCol": "weights", "numSamples": 900}

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        spx = self.getOrDefault(self.superpixelCol)
        cols = self._result_columns()
        return cols[:2] + ([(spx, ArrayType(IntegerType()))] if spx else []) + cols[2:]

    def _validate_schema(self, schema: StructType) -> None:
        from irbis.ml.columns import is_image_struct

        found = schema[self.getInputCol()].dataType
        if not is_image_struct(found):
            raise TypeError(f"ImageLIME: input column {self.getInputCol()!r} must be an image struct, "
                            f"found {found.simpleString()}")

    _to_block = staticmethod(_images_block)

    def _explainer(self) -> Callable[[Any, Callable[[np.ndarray], np.ndarray]], dict[str, Any]]:
        settings = dict(self._settings(), cell=int(round(self.getOrDefault(self.cellSize))),
                        modifier=self.getOrDefault(self.modifier),
                        fraction=self.getOrDefault(self.samplingFraction),
                        superpixels=self.getOrDefault(self.superpixelCol),
                        names=[n for n, _ in self._output_columns()],
                        network_input=_network_input(self.getModel(), self.getInputCol()))
        return partial(_explain_images, settings=settings)


def _explain_images(block: Any, score: Callable[[np.ndarray], np.ndarray], settings: dict[str, Any]) -> dict[str, Any]:
    """Explain each image of a block; a null or unusable image gets a reason (or raises without errorCol)."""
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
