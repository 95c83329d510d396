"""``ImageFeaturizer``: images to pretrained-network features (transfer learning) in one pass.

Decoding (for a bytes column), preprocessing as the model's spec prescribes and the network run in
the same Arrow batch of the same Python worker, as every :class:`~irbis.ml.image_network.ImageNetworkStage`
does: pixels never go back to the JVM between the steps.
"""
from __future__ import annotations

from typing import Any

from pyspark.ml.param import TypeConverters

from irbis.ml.base import IrbisTransformer
from irbis.ml.image_network import ImageNetworkStage
from irbis.ml.params import ColumnSetters, HasOutputLayer, Row, at_least, in_registry, table_mixin
from irbis.ml.synapseml import ImageFeaturizerNames
from irbis.models import MODELS, get_entry, module_names

__all__ = ["ImageFeaturizer"]

#: Several layers of one forward pass, each written to its own vector column.
_LAYERS_PARAMS: Any = table_mixin("_HasOutputLayers", [
    ("outputLayers", "inner modules (named_modules() names) whose activations are returned from one forward "
     "pass, each in the column of outputCols at the same position; when set they win over outputLayer, "
     "cutOutputLayers and outputCol", TypeConverters.toListString, []),
    ("outputCols", "the vector column of each layer of outputLayers, in the same order",
     TypeConverters.toListString, []),
])


_FEATURIZER_ROWS: list[Row] = [
    ("network", "the network: a model of the catalogue, which gives its preprocessing, feature layers and "
     f"weights: built-in {sorted(MODELS)} or added with irbis.models.register_model",
     TypeConverters.toString, "efficientnet_lite0", in_registry(MODELS)),
    ("weights", "other weights for the architecture of network: a catalogue name or a model folder "
     "(architecture.json + weights); empty for the weights of the catalogue entry network",
     TypeConverters.toString, ""),
    ("cutOutputLayers", "how many final layers to remove: 0 class scores, 1 pooled features, 2+ earlier "
     "activations; a non-empty outputLayer wins over it", TypeConverters.toInt, 1, at_least(0)),
]


_FeaturizerParams: Any = table_mixin("_FeaturizerParams", _FEATURIZER_ROWS)


class ImageFeaturizer(ImageFeaturizerNames, _FeaturizerParams, ImageNetworkStage,
                      ColumnSetters, HasOutputLayer, _LAYERS_PARAMS, IrbisTransformer):
    """Featurize images with a pretrained network, cutting its last ``cutOutputLayers`` layers.

    The model is a catalogue entry (:data:`irbis.models.MODELS`, built-in or added with
    :func:`irbis.models.register_model` / :func:`irbis.models.register_catalogue`): its preprocessing,
    feature layers and weights all come from that one entry.

    Parameters
    ----------
    inputCol : str
        An image struct column (from :func:`irbis.read_images` or :class:`ImageDecoder`) or a binary
        column of encoded files (e.g. ``content`` of Spark's ``binaryFile`` source), decoded in the
        same pass.
    outputCol : str
        A Spark ML vector column: class scores for ``cutOutputLayers=0``, the pooled features for 1,
        earlier (flattened) activations for larger values (see the entry's ``layers``).
    network : str
        A model name of the catalogue, e.g. ``"efficientnet_lite0"`` or ``"resnet50"``; it fixes the
        preprocessing, the feature layers and (unless ``weights`` is set) the weights.
    weights : str
        Other weights for the same architecture: a catalogue name or a model folder
        (architecture.json + weights.pt); empty means the weights of the entry named ``network``.
    cutOutputLayers : int
        How many final layers to remove: 0 class scores, 1 pooled features, 2+ earlier activations.
    outputLayer : str
        An inner module (a ``named_modules()`` name) whose activation is returned. When set it wins
        over ``cutOutputLayers``; empty (the default) means the layer ``cutOutputLayers`` picks.
    outputLayers, outputCols : list of str
        Several inner modules read in one forward pass (the network runs, and is exported, once for
        the set), each written to the vector column of ``outputCols`` at the same position. When set
        they win over ``outputLayer``, ``cutOutputLayers`` and ``outputCol``; both lists have the
        same length.
    miniBatchSize, device, precision, engine : int, str, str, str
        As in :class:`irbis.ml.TorchModel`.
    calibrationData : str or DataFrame
        For int8 on ``onnxruntime``: a folder of images or ``.npy`` input rows, or a DataFrame with an
        ``inputCol`` of images (structs or encoded bytes), whose sample (up to 256 rows) is preprocessed
        as the model prescribes when set and kept in a cached folder (saved with the stage). Empty: the
        photographs shipped with scikit-image.
    errorCol : str
        Optional column for the reason an image gave null features (undecodable bytes, a bad struct).
    maxPixels : int
        Pixel limit when decoding bytes.
    fastDecode : bool
        For a bytes column: decode a JPEG at 1/2, 1/4 or 1/8 scale (in libjpeg's DCT) when the
        result is still at least the model's resize size. Several times faster for camera-sized
        photos; the features differ slightly from those of a full decode.

    Examples
    --------
    >>> feat = ImageFeaturizer(inputCol="image", outputCol="features", cutOutputLayers=1)
    >>> feat.getNetwork(), feat.feature_layer()
    ('efficientnet_lite0', '_flatten')
    >>> feat.setOutputLayer("_blocks.10").feature_layer()
    '_blocks.10'
    >>> both = ImageFeaturizer(outputLayers=["_flatten", "_blocks.15"], outputCols=["pooled", "block15"])
    >>> both.layer_columns()
    [('_flatten', 'pooled'), ('_blocks.15', 'block15')]

    .. code-block:: python

        images = irbis.read_images("photos/", dropInvalid=True)
        features = ImageFeaturizer(inputCol="image", outputCol="features").transform(images)
        LogisticRegression(featuresCol="features").fit(features.join(labels, "path"))
    """

    _extras = ("images",)

    _defaults = {"inputCol": "image", "outputCol": "features", "errorCol": ""}

    def _check_params(self) -> None:
        self._check_layers()

    def setNetwork(self, value: str) -> "ImageFeaturizer":  # noqa: N802
        """Sets network: a model of the catalogue (checked with the layers it must have)."""
        return self._set_checked(network=value)

    def setCutOutputLayers(self, value: int) -> "ImageFeaturizer":  # noqa: N802
        return self._set_checked(cutOutputLayers=value)

    def setOutputLayer(self, value: str) -> "ImageFeaturizer":  # noqa: N802
        """Sets outputLayer: an inner module whose activation is returned (wins over cutOutputLayers)."""
        return self._set_checked(outputLayer=value)

    def setOutputLayers(self, value: list[str]) -> "ImageFeaturizer":  # noqa: N802
        """Sets outputLayers: inner modules read in one pass, each into its column of outputCols."""
        return self._set_checked(outputLayers=value)

    def setOutputCols(self, value: list[str]) -> "ImageFeaturizer":  # noqa: N802
        """Sets outputCols: the vector column of each layer of outputLayers."""
        return self._set_checked(outputCols=value)

    def feature_layer(self) -> str:
        """The module whose output is returned (empty string: the network's output): ``outputLayer``
        when set, else the entry's layer for ``cutOutputLayers``."""
        cut = self.getCutOutputLayers()
        if cut < 0:
            raise ValueError(f"cutOutputLayers must be >= 0, found {cut}")
        layer = get_entry(self.getNetwork()).cut_layer(cut) if cut else ""
        return self.getOutputLayer() or layer

    def layer_columns(self) -> list[tuple[str, str]]:
        """``(layer, column)`` of each output: the pairs of ``outputLayers`` and ``outputCols`` when set,
        else ``(feature_layer(), outputCol)``."""
        layers, cols = self.getOutputLayers(), self.getOutputCols()
        if not (layers or cols):
            return [(self.feature_layer(), self.getOutputCol())]
        if len(layers) != len(cols) or not layers:
            raise ValueError(f"outputLayers and outputCols must have the same length, one column per layer; "
                             f"found {len(layers)} layer(s) {layers} and {len(cols)} column(s) {cols}")
        if len(set(cols)) < len(cols) or len(set(layers)) < len(layers):
            raise ValueError(f"outputLayers {layers} and outputCols {cols} must each name different items")
        return list(zip(layers, cols))

    def _set_checked(self, **values: Any) -> "ImageFeaturizer":
        """Set params and validate them together; a refused value leaves the stage as it was."""
        before = {n: self.getOrDefault(n) for n in values if self.isSet(getattr(self, n))}
        self._set(**values)
        try:
            self._check_layers()
        except ValueError:
            for n in values:
                self.clear(getattr(self, n))
            self._set(**before)
            raise
        return self

    def _check_layers(self) -> None:
        """Validate network, cutOutputLayers, an explicit outputLayer and outputLayers (against the entry's
        architecture, built without weights) eagerly; outputCols' length once both lists are given."""
        from irbis.kernels.inference import unknown_layer_error

        self.feature_layer()
        layer, layers, entry = self.getOutputLayer(), self.getOutputLayers(), get_entry(self.getNetwork())
        if entry.preprocessing is None:
            raise ValueError(f"network {entry.name!r} has no preprocessing in its catalogue entry, so it "
                             f"cannot featurize images; give it one, or use TorchModel for other inputs")
        if layers and self.getOutputCols():
            self.layer_columns()
        if self.getWeights() or not (layer or layers):
            return
        known = module_names(entry.architecture, **entry.options)
        if layer and layer not in known:
            raise ValueError(f"outputLayer {layer!r} is not a module of network {entry.name!r} "
                             f"(architecture {entry.architecture!r}); its feature layers: {list(entry.layers)}")
        for name in layers:
            if name not in known:
                raise unknown_layer_error(name, [n for n in known if n], "outputLayers: layer")

    def _several_layers(self) -> bool:
        return bool(self.getOutputLayers())

    def _source(self) -> dict[str, Any]:
        """The network's source: ``weights`` when set, else the repository model ``network``."""
        from irbis.kernels.inference import resolve_source

        return resolve_source(self.getWeights() or self.getNetwork())

    def _preprocessing(self) -> Any:
        """How an image becomes the network's input: the catalogue entry's record."""
        return get_entry(self.getNetwork()).preprocessing
