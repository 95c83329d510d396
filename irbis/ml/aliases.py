"""SynapseML's names for Irbis Params: aliases that read and set the one Irbis Param.

An alias is not a second Param. ``set<Alias>`` converts the value to the Irbis Param's form and sets
that Param (its check runs as usual); ``get<Alias>`` reads the Irbis Param and converts it back.
Methods that SynapseML has and Irbis spells differently (``gaussianKernel``) are plain methods of the
stage that add the same Irbis operation. Saving,
copying, ``explainParams`` and validation therefore see only the Irbis Param, and a value set under one
name reads back under the other.

A stage lists its aliases as :class:`Alias` rows and inherits :func:`alias_mixin` of them; the rows
are kept on the class as ``SYNAPSEML_ALIASES``, the source of the migration table in the docs.

Examples
--------
>>> from pyspark.ml.param.shared import HasOutputCol
>>> class Stage(alias_mixin("Aliases", [Alias("outputColumn", "outputCol")]), HasOutputCol):
...     pass
>>> Stage().setOutputColumn("y").getOutputCol()
'y'
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from irbis.errors import ParamValueError

__all__ = ["Alias", "alias_mixin", "resolve_aliases", "one_of_any_case", "flag", "Renamed", "renamed_mixin",
           "renamed_kwargs", "renamed_metadata", "warn_renamed"]


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Alias:
    """SynapseML's name ``name`` for the Irbis Param ``target``.

    ``to_irbis`` turns a value given under SynapseML's name into the Irbis Param's value (raising
    :class:`irbis.errors.ParamValueError` for a value SynapseML would refuse); ``from_irbis``
    turns it back. ``note`` says how the meaning differs from SynapseML's (empty: the same).
    """

    name: str
    target: str
    to_irbis: Callable[[Any], Any] = _same
    from_irbis: Callable[[Any], Any] = _same
    note: str = ""


def alias_mixin(class_name: str, aliases: Sequence[Alias]) -> type:
    """A mixin with ``set<Name>``/``get<Name>`` for each alias, and ``SYNAPSEML_ALIASES``."""
    methods: dict[str, Any] = {"SYNAPSEML_ALIASES": tuple(aliases),
                               "__doc__": f"SynapseML names: {', '.join(a.name for a in aliases)}."}
    for alias in aliases:
        cap = alias.name[0].upper() + alias.name[1:]
        methods[f"set{cap}"] = _setter(alias, cap)
        methods[f"get{cap}"] = _getter(alias, cap)
    return type(class_name, (), methods)


def resolve_aliases(aliases: Sequence[Alias], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Constructor keywords with each alias given (not None) replaced by its Irbis Param and value."""
    out = {k: v for k, v in kwargs.items() if k not in {a.name for a in aliases}}
    for alias in aliases:
        if kwargs.get(alias.name) is not None:
            out[alias.target] = alias.to_irbis(kwargs[alias.name])
    return out


def _setter(alias: Alias, cap: str) -> Callable[..., Any]:
    target_setter = f"set{alias.target[0].upper()}{alias.target[1:]}"

    def setter(self: Any, value: Any) -> Any:
        # The Irbis setter, where the stage has one, runs the stage's own checks of the value.
        irbis_set = getattr(self, target_setter, None) if alias.name != alias.target else None
        value = alias.to_irbis(value)
        return irbis_set(value) if irbis_set else self._set(**{alias.target: value})

    setter.__name__ = f"set{cap}"
    setter.__doc__ = f"SynapseML's name: sets {alias.target}. {alias.note}".strip()
    return setter


def _getter(alias: Alias, cap: str) -> Callable[..., Any]:
    def getter(self: Any) -> Any:
        return alias.from_irbis(self.getOrDefault(alias.target))

    getter.__name__ = f"get{cap}"
    getter.__doc__ = f"SynapseML's name: reads {alias.target}. {alias.note}".strip()
    return getter


def one_of_any_case(name: str, *values: str) -> Callable[[Any], str]:
    """A converter accepting ``values`` in any letter case (as SynapseML does) and returning the
    value lower-cased; anything else raises :class:`ParamValueError` naming ``name``."""
    def convert(value: Any) -> str:
        if not isinstance(value, str) or value.upper() not in {v.upper() for v in values}:
            raise ParamValueError(name, value, "one of " + ", ".join(repr(v) for v in values) + " (any case)")
        return value.lower()
    return convert


def flag(name: str, when_true: Any, when_false: Any) -> Callable[[Any], Any]:
    """A converter for a SynapseML boolean that stands for one of two values of an Irbis Param."""
    def convert(value: Any) -> Any:
        if not isinstance(value, bool):
            raise ParamValueError(name, value, "True or False")
        return when_true if value else when_false
    return convert


# -- earlier Irbis names -------------------------------------------------------------------------
@dataclass(frozen=True)
class Renamed:
    """An earlier Irbis name ``old`` of the Param now called ``new`` (:mod:`irbis.ml.vocabulary`).

    The old name still works everywhere a user can meet it: ``set<Old>``/``get<Old>``, the constructor
    keyword and ``stage.<old>`` (the Param itself, so ``getOrDefault("<old>")`` works too), each warning
    once per process with a :class:`FutureWarning`; a stage saved under the old name loads
    (:func:`renamed_metadata`), silently.
    """

    old: str
    new: str


_WARNED: set[tuple[str, str]] = set()


def warn_renamed(stage: str, old: str, new: str) -> None:
    """Warn, once per process for each ``old -> new``, that the Param ``old`` is now called ``new``; the
    warning points at the user's line (the first caller outside Irbis and PySpark)."""
    if (old, new) in _WARNED:
        return
    _WARNED.add((old, new))
    warnings.warn(f"{stage}: the Param {old!r} is now called {new!r}; {old!r} still works but will be removed",
                  FutureWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warnings.warn`, called by this function's caller, that names the first
    frame outside the irbis and pyspark packages."""
    import os

    import pyspark

    irbis_folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # irbis/ml/aliases.py -> irbis
    inside = (irbis_folder + os.sep, os.path.dirname(pyspark.__file__) + os.sep)
    frame, level = sys._getframe(2), 2  # level 1 is the frame that calls warnings.warn, 2 its caller
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def renamed_mixin(class_name: str, rows: Sequence[Renamed]) -> type:
    """A mixin with, for each row, ``<old>`` (a property giving the Param ``new``), ``set<Old>`` and
    ``get<Old>``, each warning once (:func:`warn_renamed`); the rows are kept as ``RENAMED_PARAMS``.

    Examples
    --------
    >>> import warnings
    >>> from pyspark.ml.param.shared import HasOutputCol
    >>> class Stage(renamed_mixin("Renamed", [Renamed("outCol", "outputCol")]), HasOutputCol):
    ...     def setOutputCol(self, value):
    ...         return self._set(outputCol=value)
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     Stage().setOutCol("y").getOutputCol()
    'y'
    """
    methods: dict[str, Any] = {"RENAMED_PARAMS": tuple(rows),
                               "__doc__": f"Earlier names: {', '.join(f'{r.old} (now {r.new})' for r in rows)}."}
    for row in rows:
        cap, new_cap = row.old[0].upper() + row.old[1:], row.new[0].upper() + row.new[1:]
        methods[row.old] = _renamed_param(row)
        methods[f"set{cap}"] = _renamed_accessor(row, f"set{cap}", f"set{new_cap}")
        methods[f"get{cap}"] = _renamed_accessor(row, f"get{cap}", f"get{new_cap}")
    return type(class_name, (), methods)


def _renamed_param(row: Renamed) -> property:
    def param(self: Any) -> Any:
        warn_renamed(type(self).__name__, row.old, row.new)
        return getattr(self, row.new)

    return property(param, doc=f"Earlier name of the Param {row.new} (warns once).")


def _renamed_accessor(row: Renamed, name: str, target: str) -> Callable[..., Any]:
    def accessor(self: Any, *args: Any) -> Any:
        warn_renamed(type(self).__name__, row.old, row.new)
        return getattr(self, target)(*args)

    accessor.__name__ = name
    accessor.__doc__ = f"Earlier name of {target} (warns once)."
    return accessor


def renamed_kwargs(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keywords with each earlier name of ``cls``'s Params replaced by the current one (warning once)."""
    names = {r.old: r.new for r in getattr(cls, "RENAMED_PARAMS", ())}
    for old in names.keys() & kwargs.keys():
        warn_renamed(cls.__name__, old, names[old])
    return {names.get(k, k): v for k, v in kwargs.items()}


def renamed_metadata(cls: type, metadata: dict[str, Any]) -> dict[str, Any]:
    """Saved metadata with the Params saved under earlier names (``cls.RENAMED_PARAMS``) under their
    current names, so that stages saved by an earlier Irbis load; a current name present wins. Params the
    class no longer has (``cls.RETIRED_PARAMS``, which it never used) are left out."""
    names = {r.old: r.new for r in getattr(cls, "RENAMED_PARAMS", ())}
    retired = set(getattr(cls, "RETIRED_PARAMS", ()))
    if not (names or retired):
        return metadata
    out = dict(metadata)
    for key in ("paramMap", "defaultParamMap"):
        params = {k: v for k, v in (metadata.get(key) or {}).items() if k not in retired}
        renamed = {names.get(k, k): v for k, v in params.items() if k not in names}
        renamed.update({names[k]: v for k, v in params.items() if k in names and names[k] not in params})
        out[key] = renamed
    return out
