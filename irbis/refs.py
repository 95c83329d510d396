"""Python objects named in JSON: ``"package.module:qualname"`` references, resolved in one place.

Params and model folders hold JSON only. A function given to ``Lambda``, a network factory, loss or
optimizer given to ``TorchEstimator``, or the class of a network saved as its state dict is stored as
the name it can be imported back by (never pickled), in the one format that the standard library's
:func:`pkgutil.resolve_name` reads. A lambda, a closure or an object of ``__main__`` has no such
name; :func:`reference` says why, so that saving fails early instead of leaving a broken pipeline.

Pure: imports nothing of Irbis.

Examples
--------
>>> reference(resolve)
'irbis.refs:resolve'
>>> resolve("irbis.refs:resolve") is resolve
True
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from typing import Any

#: The format of a reference, in words.
FORMAT = "package.module:qualname"
_DOTTED = r"(?!\d)\w+(?:\.(?!\d)\w+)*"
_REFERENCE = re.compile(rf"{_DOTTED}:{_DOTTED}")
_UNSAVED = "<unsaved: "


def reference(obj: Any) -> str:
    """The ``"package.module:qualname"`` that imports back ``obj`` itself.

    Raises
    ------
    ValueError
        Saying why there is none: a lambda or closure, an object of ``__main__``, or a name that
        does not import back as the same object.
    """
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname:
        raise ValueError(f"{obj!r} has no __module__/__qualname__")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError(f"{qualname!r} is a lambda or a closure (defined inside another function)")
    if module == "__main__":
        raise ValueError(f"{qualname!r} is defined in __main__ (a script or notebook)")
    ref = f"{module}:{qualname}"
    try:
        found = resolve(ref)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"{ref} cannot be imported back") from None
    if found is not obj:
        raise ValueError(f"{ref} imports back as a different object")
    return ref


def is_reference(value: Any) -> bool:
    """Whether ``value`` is a reference string (``package.module:qualname``), as opposed to a name or a path
    held by the same Param."""
    return isinstance(value, str) and _REFERENCE.fullmatch(value) is not None


def unsaved(reason: str) -> str:
    """What a Param holds for a callable that has no reference: a placeholder carrying :func:`reference`'s
    reason, which saving reports (:func:`is_unsaved`)."""
    return f"{_UNSAVED}{reason}>"


def is_unsaved(value: Any) -> bool:
    """Whether ``value`` is the placeholder :func:`unsaved` makes."""
    return isinstance(value, str) and value.startswith(_UNSAVED)


def resolve(ref: str) -> Any:
    """Import the object ``ref`` names (:func:`pkgutil.resolve_name`).

    Raises
    ------
    ValueError
        When ``ref`` is not of the form ``package.module:qualname``.
    ImportError, AttributeError
        When the module or the name within it does not exist.
    """
    if not is_reference(ref):
        raise ValueError(f"a reference looks like {FORMAT!r}, found {ref!r}")
    return pkgutil.resolve_name(ref)



def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports each public name from the module
    ``exports`` maps it to on first use and keeps it in ``namespace``, the package's globals."""
    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["FORMAT", "is_reference", "is_unsaved", "lazy_exports", "reference", "resolve", "unsaved"]
