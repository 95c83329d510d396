"""Catalogue entries: what a named model is, where its weights live and how to feed it.

A catalogue is a JSON document ``{"format": "irbis-catalogue", "version": 1, "models": [entry, ...]}``.
Each entry holds plain JSON values (see :class:`CatalogueEntry`); relative weight URIs resolve against
the catalogue's own location (a folder or an HTTP(S) URL).
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from irbis.models.registry import ARCHITECTURES, ModelSpec, Preprocessing

CATALOGUE_FORMAT = "irbis-catalogue"
CATALOGUE_VERSION = 1
CATALOGUE_FILENAME = "catalogue.json"
_REQUIRED = ("name", "architecture")


@dataclass(frozen=True, eq=False)
class CatalogueEntry:
    """One model of a catalogue.

    Parameters
    ----------
    name : str
        Name users load it by.
    architecture : str
        Key of ``irbis.models.ARCHITECTURES``; built with ``architecture_kwargs``.
    uri : str or None
        Weights: ``pkg://<package>/<path>``, ``file://...``, ``http(s)://...``, or a path (relative
        paths resolve against ``base``). None when users supply the weights themselves.
    sha256, size : str or None, int or None
        Expected digest (required with a ``uri``) and size in bytes of the weight file.
    input_shape : tuple of int
        Per-sample input (C, H, W).
    layers : tuple of str
        Feature layers: ``layers[k - 1]`` is the module returned when ``k`` layers are cut.
    preprocessing : Preprocessing or None
        Mean/std (0..255 units), colour order, input size, resize and interpolation.
    base : str or None
        Folder or URL that relative URIs resolve against (not serialised).
    """

    name: str
    architecture: str
    uri: str | None = None
    sha256: str | None = None
    size: int | None = None
    architecture_kwargs: Mapping[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] = ()
    layers: tuple[str, ...] = ()
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (without ``base``)."""
        d = asdict(self)
        d.pop("base")
        d["architecture_kwargs"] = dict(self.architecture_kwargs)
        d["input_shape"], d["layers"] = list(self.input_shape), list(self.layers)
        if self.preprocessing is not None:
            d["preprocessing"] = {k: list(v) if isinstance(v, tuple) else v
                                  for k, v in asdict(self.preprocessing).items()}
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
        pre = kw.get("preprocessing")
        if pre is not None:
            pre = dict(pre)
            for k in ("input_size", "mean", "std"):
                pre[k] = tuple(pre[k])
            kw["preprocessing"] = Preprocessing(**pre)
        kw["input_shape"] = tuple(kw.get("input_shape", ()))
        kw["layers"] = tuple(kw.get("layers", ()))
        kw["architecture_kwargs"] = dict(kw.get("architecture_kwargs") or {})
        return cls(**kw, base=base)

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> CatalogueEntry:
        """The entry describing a registered :class:`ModelSpec` (its weights, if any, included)."""
        if spec.architecture is None:
            raise ValueError(f"model {spec.name!r} has no architecture name, so it cannot be catalogued")
        w = spec.weights
        return cls(name=spec.name, architecture=spec.architecture, uri=w and w.uri, sha256=w and w.sha256,
                   size=w and w.size_bytes, architecture_kwargs=dict(spec.architecture_kwargs),
                   input_shape=spec.input_shape, layers=spec.cut_layers, preprocessing=spec.preprocessing,
                   num_classes=spec.num_classes, description=spec.description)


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value.lower())


def is_url(location: str) -> bool:
    """True for http(s) URLs."""
    return urllib.parse.urlsplit(location).scheme in ("http", "https")


def read_catalogue(source: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> list[CatalogueEntry]:
    """Entries of a catalogue: None (the built-in one), a folder holding ``catalogue.json``, a JSON file,
    or an HTTP(S) URL of a JSON file."""
    if source is None:
        text = resources.files("irbis.models").joinpath(CATALOGUE_FILENAME).read_text(encoding="utf-8")
        return parse_catalogue(text, base=None, origin="the built-in catalogue")
    src = os.fspath(source)
    if is_url(src):
        with urllib.request.urlopen(src, timeout=timeout) as response:
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
