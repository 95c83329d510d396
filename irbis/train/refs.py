"""Python callables as JSON: ``"python:module:qualname"`` references.

Params hold JSON only. A network factory, loss or optimizer factory given as a
callable is persisted as a reference to an importable top-level object (never
pickled); a lambda or closure cannot be saved, and saying so early beats a
broken saved pipeline.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

PREFIX = "python:"


def callable_ref(fn: Callable[..., Any]) -> str | None:
    """``"python:module:qualname"`` if ``fn`` can be imported back by that name, else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        return None
    try:
        return f"{PREFIX}{module}:{qualname}" if resolve_ref(f"{PREFIX}{module}:{qualname}") is fn else None
    except (ImportError, AttributeError, ValueError):
        return None


def is_ref(value: Any) -> bool:
    """Whether ``value`` is a ``python:`` reference string."""
    return isinstance(value, str) and value.startswith(PREFIX)


def resolve_ref(ref: str) -> Callable[..., Any]:
    """Import the object a ``python:module:qualname`` reference names."""
    body = ref[len(PREFIX):]
    module, sep, qualname = body.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"a callable reference looks like 'python:package.module:function', found {ref!r}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{ref!r} names a {type(obj).__name__}, not a callable")
    return obj
