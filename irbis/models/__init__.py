"""Pure model layer: architectures, the model-spec registry, preprocessing and the model repository.

Imports torch (and cv2 for preprocessing), never pyspark.
"""

from irbis.models.catalogue import CatalogueEntry, read_catalogue
from irbis.models.fetch import ChecksumMismatchError, default_cache_dir
from irbis.models.preprocess import preprocess_rgb
from irbis.models.registry import (
    ARCHITECTURES,
    MODELS,
    ModelSpec,
    Preprocessing,
    WeightsRef,
    build_model,
    get_spec,
    layer_output_shapes,
    register,
)
from irbis.models.repository import ModelRepository
from irbis.models.weights import UnsafeModelFileError, safe_load_state_dict, sha256_file

__all__ = [
    "ARCHITECTURES",
    "MODELS",
    "CatalogueEntry",
    "ChecksumMismatchError",
    "ModelRepository",
    "ModelSpec",
    "Preprocessing",
    "UnsafeModelFileError",
    "WeightsRef",
    "build_model",
    "default_cache_dir",
    "get_spec",
    "layer_output_shapes",
    "preprocess_rgb",
    "read_catalogue",
    "register",
    "safe_load_state_dict",
    "sha256_file",
]
