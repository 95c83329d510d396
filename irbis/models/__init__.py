"""Pure model layer, the ground: architectures, the model catalogue and registry, the preprocessing record
and the repository.

Imports torch, never pyspark, and nothing of Irbis above it: the pixels are preprocessed by
:func:`irbis.kernels.image.network_input.preprocess_rgb`, which reads the catalogue's record. The names below
are imported on first use (PEP 562), so a process that needs only the file helpers
(:mod:`irbis.models.fetch`: the cache folder, locks, checksums), such as a Spark worker running an
exported network, does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {
    "ARCHITECTURES": "architectures", "build_model": "architectures", "layer_output_shapes": "architectures",
    "module_names": "architectures",
    "CatalogueEntry": "catalogue", "read_catalogue": "catalogue",
    "ChecksumMismatchError": "fetch", "default_cache_dir": "fetch",
    "Preprocessing": "preprocess",
    "MODELS": "registry", "get_entry": "registry", "preprocessing_for": "registry", "register_catalogue": "registry",
    "register_model": "registry", "unregister_model": "registry",
    "ModelRepository": "repository",
    "UnsafeModelFileError": "weights", "safe_load_state_dict": "weights", "sha256_file": "weights",
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    if name == "preprocess_rgb":
        raise AttributeError("irbis.models.preprocess_rgb moved to the image kernels: import it from "
                             "irbis.kernels.image.network_input (or use irbis.preprocess_rgb)")
    if name not in _SOURCES:
        raise AttributeError(f"module 'irbis.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"irbis.models.{_SOURCES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))
