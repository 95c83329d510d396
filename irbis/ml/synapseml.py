"""SynapseML's parameter and method names on Irbis's stages, as aliases of Irbis's Params.

Each stage that SynapseML also has takes one mixin from here: its :class:`irbis.ml.aliases.Alias`
rows (``set``/``get`` under SynapseML's name, reading and setting the Irbis Param) and the few
methods SynapseML spells differently. ``docs/synapseml.md`` is the user's table of these names.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from pyspark.sql.types import DataType, FloatType

from irbis.errors import ParamValueError
from irbis.kernels.image.op_chain import ImageChain
from irbis.ml.aliases import Alias, alias_mixin, flag, one_of_any_case
from irbis.models import default_cache_dir

__all__ = ["ONNX_ALIASES", "IMAGE_TRANSFORMER_ALIASES", "IMAGE_FEATURIZER_ALIASES", "TEXT_FEATURIZER_ALIASES",
           "ENSEMBLE_ALIASES", "FEATURIZE_ALIASES", "TEXT_CLASSIFIER_ALIASES", "TEXT_EMBEDDER_ALIASES",
           "ImageTransformerNames", "ImageFeaturizerNames", "TextFeaturizerNames", "EnsembleByKeyNames",
           "ONNXModelNames", "DECODING_ERROR_COL", "comma_list", "int_map", "same_names"]


def same_names(*names: str) -> list[Alias]:
    """Setters and getters SynapseML has for Params of the same name (``setKeys`` for ``keys``)."""
    return [Alias(name, name) for name in names]


def toListStringOrCommas(value: Any) -> list[str]:  # noqa: N802 (named like PySpark's converters)
    """Param converter: a list of strings, or SynapseML's comma-separated string ``"a, the, and"``."""
    if isinstance(value, str):
        return [w.strip() for w in value.split(",") if w.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(w, str) for w in value):
        raise TypeError(f"expected a list of strings or a comma-separated string, found {value!r}")
    return list(value)


comma_list = toListStringOrCommas

def int_map(name: str) -> Any:
    """Param converter for ``name``: a dict of column name -> positive int (SynapseML's vectorDims)."""
    def convert(value: Any) -> dict[str, int]:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise TypeError(f"{name}: expected a dict of column name -> int, found {value!r}")
        for col, size in value.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ParamValueError(name, value, f"a positive int for each column (column {col!r} has {size!r})")
        return dict(value)
    convert.__name__ = "toColumnIntMap"
    return convert


# -- ONNXModel -----------------------------------------------------------------------------------
def _payload_to_path(payload: Any) -> str:
    """``modelPayload`` bytes kept as a content-addressed file, so that ``network`` can name them."""
    if not isinstance(payload, (bytes, bytearray, memoryview)) or not len(payload):
        raise ParamValueError("modelPayload", type(payload).__name__, "the bytes of an ONNX graph")
    data = bytes(payload)
    dest = default_cache_dir() / "onnx" / f"{hashlib.sha256(data).hexdigest()[:24]}.onnx"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=dest.parent, suffix=".part", delete=False) as part:
            part.write(data)
        os.replace(part.name, dest)  # atomic: a concurrent reader never sees half a graph
    return str(dest)


ONNX_ALIASES = [
    Alias("modelLocation", "network", note="a local path (shipped to the executors by Irbis); SynapseML "
          "reads any Hadoop URI into modelPayload"),
    Alias("modelPayload", "network", _payload_to_path, lambda path: Path(path).read_bytes(),
          note="the bytes are kept in a content-addressed file of the model cache, which network names"),
    Alias("deviceType", "device", one_of_any_case("deviceType", "CPU", "CUDA"), lambda d: d.upper(),
          note="unset means device's default, cpu (device='auto' picks CUDA when one is visible)"),
]

# -- image stages --------------------------------------------------------------------------------
#: ``ignoreDecodingErrors=True`` (SynapseML) stands for this ``errorCol`` (Irbis): a bad image gives
#: null output and its reason in this column instead of failing the job.
DECODING_ERROR_COL = "error"

_IGNORE_DECODING_ERRORS = Alias(
    "ignoreDecodingErrors", "errorCol", flag("ignoreDecodingErrors", DECODING_ERROR_COL, ""), bool,
    note=f"True sets errorCol={DECODING_ERROR_COL!r}: a bad image gives null and its reason there")

def _synapse_stage(stage: dict[str, Any]) -> dict[str, Any]:
    """One SynapseML stage map (``{"stageName": "resize", ...}``) as an Irbis op dict."""
    if "stageName" not in stage:
        return stage  # already an Irbis op
    name, args = str(stage["stageName"]).lower(), {k: v for k, v in stage.items() if k != "stageName"}
    if name == "resize" and "size" in args:
        keep = bool(args.get("keepAspectRatio", True))
        return {"op": "resize", "height": args["size"], "width": args["size"], "keep_aspect_ratio": keep}
    simple = {"resize": ("resize", {}), "crop": ("crop", {}), "centercrop": ("center_crop", {}),
              "flip": ("flip", {"flipCode": "flip_code"}),
              "threshold": ("threshold", {"maxVal": "max_val", "type": "type"}),
              "gaussiankernel": ("blur", {"apertureSize": "height", "sigma": "sigma"})}
    if name not in simple:
        raise ParamValueError("stages", stage, f"a stage named one of {sorted(simple)} (use the ImageTransformer "
                              f"methods, e.g. colorFormat('RGB'), for the others)")
    op, renames = simple[name]
    out = {"op": op, **{renames.get(k, k): v for k, v in args.items()}}
    if name == "gaussiankernel":
        out["width"] = 1
    if name == "threshold" and isinstance(out.get("type"), int):
        from irbis.kernels.image.ops import THRESHOLD_TYPES

        out["type"] = {code: key for key, code in THRESHOLD_TYPES.items()}[out["type"]]
    return out


def _stages_to_ops(stages: Any) -> Any:
    """SynapseML's ``stages`` (a list of stage maps, or its JSON text) as Irbis ops."""
    if isinstance(stages, str):
        import json

        stages = json.loads(stages)
    return [_synapse_stage(dict(s)) for s in stages]


IMAGE_TRANSFORMER_ALIASES = [
    Alias("toTensor", "outputFormat", flag("toTensor", "array", "image"), lambda fmt: fmt != "image",
          note="the tensor is one flat array<float> in CHW order (SynapseML: nested C, H, W arrays); "
               "outputFormat='vector' gives a Spark ML vector"),
    Alias("stages", "ops", _stages_to_ops, note="SynapseML's stage maps ({'stageName': 'resize', ...}) become "
          "Irbis's op dicts; getStages gives the op dicts"),
    _IGNORE_DECODING_ERRORS,
]

IMAGE_FEATURIZER_ALIASES = [
    Alias("headless", "cutOutputLayers", flag("headless", 1, 0), lambda cut: cut > 0,
          note="True cuts the classifier (cutOutputLayers=1); cutOutputLayers also reaches earlier layers"),
    Alias("featureTensorName", "outputLayer", note="a module name of the torch network (named_modules()), "
          "not an ONNX node name"),
    Alias("model", "network", note="a name of the Irbis model catalogue (SynapseML: of its ONNX hub)"),
    Alias("modelLocation", "weights", note="weights for the architecture of network: a model folder or "
          "catalogue name; preprocessing comes from the catalogue entry"),
    _IGNORE_DECODING_ERRORS,
]

TEXT_FEATURIZER_ALIASES = [
    Alias("defaultStopWordLanguage", "stopWordsLanguage",
          note="'custom' is not needed: a non-empty stopWords always wins over the language's list"),
    *same_names("inputCol", "outputCol", "useTokenizer", "tokenizerPattern", "tokenizerGaps", "minTokenLength",
                "toLowercase", "useStopWordsRemover", "stopWords", "caseSensitiveStopWords", "useNGram",
                "nGramLength", "numFeatures", "binary", "useIDF", "minDocFreq"),
]

ENSEMBLE_ALIASES = same_names("keys", "cols", "colNames", "strategy", "collapseGroup", "vectorDims")

#: Featurize: SynapseML's name of numHashBuckets (SynapseML hashes every string column into numFeatures
#: slots, by default 2^18; Irbis one-hot encodes strings of at most maxCategories values and hashes the others).
FEATURIZE_ALIASES = [Alias("numFeatures", "numHashBuckets", note="Irbis hashes only strings with more than "
                           "maxCategories distinct values (SynapseML: every string column; default 2^18)")]

#: TextClassifier: the names of SynapseML's DeepTextClassifier.
TEXT_CLASSIFIER_ALIASES = [Alias("textCol", "inputCol"),
                           Alias("checkpoint", "backbone", note="a catalogue encoder or a local Hugging Face-format "
                                                                "folder; nothing is downloaded from a hub"),
                           Alias("maxTokenLen", "maxLength")]

#: TextEmbedder: the names of SynapseML's HuggingFaceSentenceEmbedder.
TEXT_EMBEDDER_ALIASES = [Alias("modelName", "network", note="a text network of the catalogue or a Hugging "
                               "Face-format folder; nothing is downloaded from a hub"),
                         Alias("batchSize", "miniBatchSize", note="the most texts per batch; the token budget "
                               "cuts batches of long texts smaller")]

_ImageTransformerAliases: Any = alias_mixin("_ImageTransformerAliases", IMAGE_TRANSFORMER_ALIASES)
ImageFeaturizerNames: Any = alias_mixin("ImageFeaturizerNames", IMAGE_FEATURIZER_ALIASES)
TextFeaturizerNames: Any = alias_mixin("TextFeaturizerNames", TEXT_FEATURIZER_ALIASES)
EnsembleByKeyNames: Any = alias_mixin("EnsembleByKeyNames", ENSEMBLE_ALIASES)
ONNXModelNames: Any = alias_mixin("ONNXModelNames", ONNX_ALIASES)


class ImageTransformerNames(_ImageTransformerAliases):
    """SynapseML's ImageTransformer names: the aliases, and methods on the same ``ops``."""

    SYNAPSEML_METHODS = ("gaussianKernel", "setTensorChannelOrder", "setTensorElementType")

    def gaussianKernel(self, apertureSize: int, sigma: float) -> Any:  # noqa: N802
        """SynapseML's Gaussian filter: a ``blur`` with an ``apertureSize`` x 1 kernel.

        SynapseML filters with ``getGaussianKernel(apertureSize, sigma)``, a single column, which is
        a Gaussian blur of height ``apertureSize`` and width 1.
        """
        return self.blur(apertureSize, 1, sigma)

    def setTensorChannelOrder(self, value: str) -> Any:  # noqa: N802
        """SynapseML's channel order of the tensor, RGB or BGR: a ``colorFormat`` op placed before the
        first ``normalize`` op, so that means and stds are in that order as in SynapseML."""
        order = one_of_any_case("tensorChannelOrder", "RGB", "BGR")(value).upper()
        ops = [op for op in self.getOps() if not _is_channel_order(op)]
        at = next((i for i, op in enumerate(ops) if op["op"] == "normalize"), len(ops))
        return self._set(ops=ops[:at] + ImageChain([]).then("color_format", format=order).ops + ops[at:])

    def getTensorChannelOrder(self) -> str:  # noqa: N802
        """The channel order the ops leave: the last RGB/BGR ``colorFormat``, else BGR (OpenCV's)."""
        orders = [op["format"] for op in self.getOps() if _is_channel_order(op)]
        return orders[-1] if orders else "BGR"

    def setTensorElementType(self, value: Any) -> Any:  # noqa: N802
        """SynapseML's tensor element type: Irbis tensors are float32, so FloatType (or "float") only."""
        name = value.typeName() if hasattr(value, "typeName") else str(value).lower()
        if name != "float":
            raise ParamValueError("tensorElementType", value, "FloatType (Irbis tensors are float32; "
                                  "cast the output column to double after the transform)")
        return self

    def getTensorElementType(self) -> DataType:  # noqa: N802
        """FloatType, the element type of Irbis's tensors."""
        return FloatType()


def _is_channel_order(op: dict[str, Any]) -> bool:
    return op["op"] == "color_format" and op["format"] in ("RGB", "BGR")
