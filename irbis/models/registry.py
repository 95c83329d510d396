"""The process-wide registry of named models: the shipped catalogue plus what users register.

The shipped ``catalogue.json`` is the single source of the built-in models; :data:`MODELS` is a
read-only view of the registry (built-in entries and those added with :func:`register_model` or
:func:`register_catalogue`), the source for Param validation, docs and the conformance suite. A
:class:`irbis.models.ModelRepository` starts from it, so a registered name works everywhere a model
name does (``ImageFeaturizer(network=...)``, ``TorchModel(network=...)``).

Examples
--------
>>> from irbis.models import get_entry, register_model, unregister_model
>>> _ = register_model({"name": "digits_mlp_16", "architecture": "mlp",
...                     "options": {"in_features": 64, "hidden": 16, "out_features": 10},
...                     "input_shape": [64], "num_classes": 10})
>>> get_entry("digits_mlp_16").architecture
'mlp'
>>> unregister_model("digits_mlp_16")
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from irbis.models.catalogue import CatalogueEntry, read_catalogue
from irbis.models.preprocess import Preprocessing

_LOCK = threading.Lock()
_REGISTERED: dict[str, CatalogueEntry] = {}


@functools.lru_cache(maxsize=1)
def shipped_entries() -> tuple[CatalogueEntry, ...]:
    """The entries of the catalogue that ships with Irbis (parsed once per process)."""
    return tuple(read_catalogue(None))


def known_entries() -> dict[str, CatalogueEntry]:
    """Name -> entry of every model of the registry (a fresh dict: built-in, then registered)."""
    entries = {e.name: e for e in shipped_entries()}
    with _LOCK:
        entries.update(_REGISTERED)
    return entries


class _ModelsView(Mapping[str, CatalogueEntry]):
    """Read-only mapping of model name to :class:`CatalogueEntry` (built-in and registered)."""

    def __getitem__(self, name: str) -> CatalogueEntry:
        return known_entries()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(known_entries())

    def __len__(self) -> int:
        return len(known_entries())

    def __repr__(self) -> str:
        return f"MODELS({sorted(self)})"


MODELS: Mapping[str, CatalogueEntry] = _ModelsView()


def get_entry(name: str) -> CatalogueEntry:
    """The catalogue entry of the model called ``name`` (built-in or registered)."""
    entries = known_entries()
    if name not in entries:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(entries)} (add one with "
                         f"irbis.models.register_model or register_catalogue)")
    return entries[name]


def preprocessing_for(value: str) -> Preprocessing | None:
    """The images' :class:`~irbis.models.preprocess.Preprocessing` an ``imagePreprocessing`` value names: a
    catalogue model's record, or the record itself as JSON; None for an empty value."""
    if not value:
        return None
    if value in MODELS:
        found = get_entry(value).preprocessing
        if found is None:
            raise ValueError(f"catalogue model {value!r} has no preprocessing record")
        return found
    return Preprocessing.from_dict(json.loads(value))


def register_model(entry: CatalogueEntry | Mapping[str, Any], *, overwrite: bool = False) -> CatalogueEntry:
    """Add a model to this process's registry, usable by name from then on.

    Parameters
    ----------
    entry : CatalogueEntry or mapping
        The entry, or its JSON dict (relative weight URIs then resolve from the current directory).
    overwrite : bool
        Replace an entry of the same name (a built-in one included) instead of refusing.
    """
    if not isinstance(entry, CatalogueEntry):
        entry = CatalogueEntry.from_dict(entry, base=os.getcwd())
    with _LOCK:
        known = entry.name in _REGISTERED or entry.name in {e.name for e in shipped_entries()}
        if known and not overwrite:
            raise ValueError(f"model {entry.name!r} is already registered; pass overwrite=True to replace it")
        _REGISTERED[entry.name] = entry
    return entry


def register_catalogue(source: str | os.PathLike[str], *, overwrite: bool = True) -> list[str]:
    """Register every entry of a user catalogue (a folder holding ``catalogue.json``, a JSON file or an
    HTTP(S) URL); returns their names."""
    entries = read_catalogue(source)
    for entry in entries:
        register_model(entry, overwrite=overwrite)
    return [e.name for e in entries]


def unregister_model(name: str) -> None:
    """Remove a model added with :func:`register_model` (built-in entries stay)."""
    with _LOCK:
        _REGISTERED.pop(name, None)
