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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from irbis.errors import ParamValueError

__all__ = ["Alias", "alias_mixin", "resolve_aliases", "one_of_any_case", "flag"]


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


def alias_mixin(class_name: str, aliases: Sequence[Alias]) -> Any:
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

