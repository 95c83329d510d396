"""Catalogue entries: the one description of a named model.

A catalogue is a JSON document ``{"format": "irbis-catalogue", "version": 1, "models": [entry, ...]}``.
Each entry holds plain JSON values (see :class:`CatalogueEntry`): the architecture and its ``options``,
the preprocessing, the feature layers, the weights and the number of classes. The shipped
``catalogue.json`` is the source of the built-in models; relative weight URIs resolve against the
catalogue's own location (a folder or an HTTP(S) URL).

Examples
--------
>>> entry = CatalogueEntry.from_dict({
...     "name": "tiny", "architecture": "small_cnn", "options": {"num_classes": 3},
...     "preprocessing": {"input_size": [32, 32], "mean": [127, 127, 127], "std": [64, 64, 64]},
...     "layers": ["flatten"], "num_classes": 3})
>>> entry.input_shape, entry.cut_layer(1)
((3, 32, 32), 'flatten')
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from torch import nn

from irbis.models.architectures import ARCHITECTURES, build_model
from irbis.models.fetch import DEFAULT_TIMEOUT, open_url
from irbis.models.preprocess import Preprocessing

CATALOGUE_FORMAT = "irbis-catalogue"
CATALOGUE_VERSION = 1
CATALOGUE_FILENAME = "catalogue.json"
_REQUIRED = ("name", "architecture")


@dataclass(frozen=True, eq=False)
class CatalogueEntry:
    """One named model: architecture, input format, feature layers and weights.

    Parameters
    ----------
    name : str
        Name users load it by (``ImageFeaturizer(network=...)``, ``TorchModel(network=...)``).
    architecture : str
        Key of ``irbis.models.ARCHITECTURES``; built with ``options``.
    options : mapping
        Keyword arguments of the architecture's builder.
    uri : str or None
        Weights: ``pkg://<package>/<path>``, ``file://...``, ``http(s)://...``, or a path (relative
        paths resolve against ``base``). None when users supply the weights themselves.
    sha256, size : str or None, int or None
        Expected digest (required with a ``uri``) and size in bytes of the weight file.
    input_shape : tuple of int
        Per-sample input (C, H, W); taken from ``preprocessing`` when left empty.
    layers : tuple of str
        Feature layers: ``layers[k - 1]`` is the module returned when ``k`` layers are cut (k = 1: the
        pooled features in front of the classifier, larger k earlier activations).
    layer_shapes : tuple of tuple of int
        Optional per-sample output shape of each feature layer at ``input_shape``.
    preprocessing : Preprocessing or None
        Mean/std (0..255 units), colour order, input size, resize and interpolation.
    num_classes : int or None
        Width of the network's output.
    base : str or None
        Folder or URL that relative URIs resolve against (not serialised).
    """

    name: str
    architecture: str
    options: Mapping[str, Any] = field(default_factory=dict)
    uri: str | None = None
    sha256: str | None = None
    size: int | None = None
    input_shape: tuple[int, ...] = ()
    layers: tuple[str, ...] = ()
    layer_shapes: tuple[tuple[int, ...], ...] = ()
    preprocessing: Preprocessing | None = None
    num_classes: int | None = None
    description: str = ""
    base: str | None = None

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"catalogue entry {self.name!r}: unknown architecture {self.architecture!r}; "
                             f"known: {sorted(ARCHITECTURES)}")
        if self.uri is not None and not _is_sha256(self.sha256):
            raise ValueError(f"catalogue entry {self.name!r}: a uri needs a sha256 of 64 hex digits, "
                             f"found {self.sha256!r}; compute it with irbis.models.sha256_file(path)")
        pre = self.preprocessing
        if pre is not None and not self.input_shape:
            object.__setattr__(self, "input_shape", pre.input_shape)
        if pre is not None and tuple(self.input_shape) != pre.input_shape:
            raise ValueError(f"catalogue entry {self.name!r}: input_shape {list(self.input_shape)} differs "
                             f"from the preprocessing's {list(pre.input_shape)}; leave input_shape out")
        if self.layer_shapes and len(self.layer_shapes) != len(self.layers):
            raise ValueError(f"catalogue entry {self.name!r}: {len(self.layers)} layers but "
                             f"{len(self.layer_shapes)} layer_shapes")

    def cut_layer(self, k: int) -> str:
        """Name of the module whose output is returned when ``k`` (>= 1) layers are cut."""
        if not 1 <= k <= len(self.layers):
            raise ValueError(f"model {self.name!r} supports cutting 1..{len(self.layers)} layers, found {k}")
        return self.layers[k - 1]

    def build(self) -> nn.Module:
        """A fresh, randomly initialised module in eval mode (no weights loaded)."""
        return build_model(self.architecture, **self.options)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (without ``base``); ``input_shape`` only where no preprocessing implies it."""
        d: dict[str, Any] = {"name": self.name, "architecture": self.architecture, "options": dict(self.options),
                             "uri": self.uri, "sha256": self.sha256, "size": self.size}
        if self.preprocessing is None:
            d["input_shape"] = list(self.input_shape)
        else:
            d["preprocessing"] = self.preprocessing.to_dict()
        d["layers"] = list(self.layers)
        if self.layer_shapes:
            d["layer_shapes"] = [list(s) for s in self.layer_shapes]
        d["num_classes"], d["description"] = self.num_classes, self.description
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], base: str | None = None) -> CatalogueEntry:
        """Parse one JSON entry, naming missing or unknown keys."""
        known = {f for f in cls.__dataclass_fields__ if f != "base"}
        missing = [k for k in _REQUIRED if k not in d]
        unknown = sorted(set(d) - known)
        if missing or unknown:
            raise ValueError(f"catalogue entry {d.get('name', '?')!r}: missing keys {missing}, unknown keys "
                             f"{unknown}; allowed keys: {sorted(known)}")
        kw = dict(d)
        if kw.get("preprocessing") is not None:
            kw["preprocessing"] = Preprocessing.from_dict(kw["preprocessing"])
        kw["input_shape"] = tuple(kw.get("input_shape") or ())
        kw["layers"] = tuple(kw.get("layers") or ())
        kw["layer_shapes"] = tuple(tuple(s) for s in kw.get("layer_shapes") or ())
        kw["options"] = dict(kw.get("options") or {})
        return cls(**kw, base=base)


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value.lower())


def is_url(location: str) -> bool:
    """True for http(s) URLs."""
    return urllib.parse.urlsplit(location).scheme in ("http", "https")


def read_catalogue(source: str | os.PathLike[str] | None = None,
                   timeout: float = DEFAULT_TIMEOUT) -> list[CatalogueEntry]:
    """Entries of a catalogue: None (the built-in one), a folder holding ``catalogue.json``, a JSON file,
    or an HTTP(S) URL of a JSON file."""
    if source is None:
        text = resources.files("irbis.models").joinpath(CATALOGUE_FILENAME).read_text(encoding="utf-8")
        return parse_catalogue(text, base=None, origin="the built-in catalogue")
    src = os.fspath(source)
    if is_url(src):
        with open_url(src, timeout) as response:
            text = response.read().decode("utf-8")
        return parse_catalogue(text, base=src, origin=src)
    path = Path(src[len("file://"):] if src.startswith("file://") else src)
    if path.is_dir():
        path = path / CATALOGUE_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"catalogue not found: {path} (give a folder holding {CATALOGUE_FILENAME}, "
                                f"a JSON file or an http(s) URL)")
    return parse_catalogue(path.read_text(encoding="utf-8"), base=str(path.parent.resolve()), origin=str(path))


def parse_catalogue(text: str, base: str | None, origin: str) -> list[CatalogueEntry]:
    """Parse catalogue JSON text; ``origin`` names it in errors."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{origin} is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != CATALOGUE_FORMAT or not isinstance(doc.get("models"), list):
        raise ValueError(f"{origin} is not an Irbis catalogue: expected an object with "
                         f"format={CATALOGUE_FORMAT!r} and a 'models' list")
    if doc.get("version", CATALOGUE_VERSION) > CATALOGUE_VERSION:
        raise ValueError(f"{origin} has catalogue version {doc['version']}; this Irbis reads up to "
                         f"{CATALOGUE_VERSION}, upgrade irbis")
    return [CatalogueEntry.from_dict(d, base=base) for d in doc["models"]]


def dump_catalogue(entries: list[CatalogueEntry]) -> str:
    """Catalogue JSON text for ``entries``."""
    doc = {"format": CATALOGUE_FORMAT, "version": CATALOGUE_VERSION, "models": [e.to_dict() for e in entries]}
    return json.dumps(doc, indent=2) + "\n"
