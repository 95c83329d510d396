"""Pure model layer: architectures, the model catalogue and registry, preprocessing and the repository.

Imports torch (and cv2 for preprocessing), never pyspark.
"""

from irbis.models.architectures import ARCHITECTURES, build_model, layer_output_shapes, module_names
from irbis.models.catalogue import CatalogueEntry, read_catalogue
from irbis.models.fetch import ChecksumMismatchError, default_cache_dir
from irbis.models.preprocess import Preprocessing, preprocess_rgb
from irbis.models.registry import (
    MODELS,
    get_entry,
    register_catalogue,
    register_model,
    unregister_model,
)
from irbis.models.repository import ModelRepository
from irbis.models.weights import UnsafeModelFileError, safe_load_state_dict, sha256_file

__all__ = [
    "ARCHITECTURES",
    "MODELS",
    "CatalogueEntry",
    "ChecksumMismatchError",
    "ModelRepository",
    "Preprocessing",
    "UnsafeModelFileError",
    "build_model",
    "default_cache_dir",
    "get_entry",
    "layer_output_shapes",
    "module_names",
    "preprocess_rgb",
    "read_catalogue",
    "register_catalogue",
    "register_model",
    "safe_load_state_dict",
    "sha256_file",
    "unregister_model",
]
