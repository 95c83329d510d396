"""What the commands of ``irbis`` share: plain-text help, registries read when first asked for, the flags that
mean one thing on every command (``--master``, ``--precision``, a catalogue network), and the frames several
commands read or write.

Light to import: a registry that needs torch or a module that needs pyspark is imported where it is used, so
that ``irbis --help`` and the parsing of one command import neither.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

_ROLE = re.compile(r":[\w.:-]+:`~?([^`<]*?)\s*(?:<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`", re.DOTALL)  # markup may wrap onto the next line

#: Where ``irbis demo`` writes its report by default (``--text``: its text folder), and ``irbis photos`` its
#: photographs.
DEMO_OUTPUT = "irbis-demo-output"


def plain_text(text: str) -> str:
    """``text`` without reStructuredText markup: ``:role:`~a.b.c``` gives ``c`` (``a.b.c`` without the
    tilde), double and single backquotes go, their text stays.

    Examples
    --------
    >>> plain_text("The ``irbis`` command: :func:`~irbis.spark.session.get_spark`, :data:`STRATEGIES`")
    'The irbis command: get_spark, STRATEGIES'
    """
    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        return target.rsplit(".", 1)[-1] if match.group(0).split("`", 1)[1].startswith("~") else target

    return _LITERAL.sub(lambda m: m.group(1) or m.group(2), _ROLE.sub(role, text))


class PlainFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help text as a terminal shows it: the docstrings' reStructuredText markup taken out, and each option's
    default (unless it has none, is a switch, or its help already says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.default is None or action.default is False or action.default == argparse.SUPPRESS
                or "default" in text or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        build = getattr(action, "build_help", None)
        if build is not None:  # help from a registry that needs torch, read when shown
            action.help = build()
            setattr(action, "build_help", None)
        return plain_text(super()._expand_help(action))


class Parser(argparse.ArgumentParser):
    """An argument parser whose help is plain text; its sub-command parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", PlainFormatter)
        super().__init__(*args, **kwargs)


def names(values: Any) -> str:
    """``values`` as a comma-separated list, for a help text."""
    return ", ".join(values)


class Lazy:
    """The names of a registry, read when first asked for (to check a value, or for help), so that a command
    whose registry needs torch does not import it for ``irbis --help`` or another command."""

    def __init__(self, load: Any) -> None:
        self._load = load
        self._names: list[str] | None = None

    def _get(self) -> list[str]:
        if self._names is None:
            self._names = list(self._load())
        return self._names

    def __iter__(self) -> Any:
        return iter(self._get())

    def __contains__(self, value: object) -> bool:
        return value in self._get()

    def __len__(self) -> int:
        return len(self._get())


def help_later(action: argparse.Action, build: Any) -> None:
    """Give ``action`` the help text ``build()``, built when the help is shown (see :class:`PlainFormatter`)."""
    action.build_help = build  # type: ignore[attr-defined]


def image_models(num_classes: int | None = None) -> list[str]:
    """The models of the registry (irbis.models.MODELS) with a preprocessing record, those that read images;
    with ``num_classes``, only those with that many classes."""
    from irbis.models import MODELS

    return sorted(name for name, entry in MODELS.items() if entry.preprocessing is not None
                  and num_classes in (None, entry.num_classes))


def model_option(parser: argparse.ArgumentParser, flag: str, what: str, num_classes: int | None = None) -> None:
    """``flag``: a name of :func:`image_models`, ``efficientnet_lite0`` by default."""
    def catalogue() -> list[str]:
        return image_models(num_classes)

    action = parser.add_argument(flag, default="efficientnet_lite0", choices=Lazy(catalogue), metavar="NETWORK",
                                 help=what)
    help_later(action, lambda: f"{what} (irbis.models.MODELS): {names(catalogue())} (default: efficientnet_lite0)")


def master_option(parser: argparse.ArgumentParser) -> None:
    """``--master``, the Spark master URL of every command, :data:`irbis.spark.DEFAULT_MASTER` by default."""
    from irbis.spark import DEFAULT_MASTER

    parser.add_argument("--master", default=DEFAULT_MASTER, help="Spark master URL")


def precision_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--precision``, one of :data:`irbis.kernels.inference.PRECISIONS`, ``fp32`` by default."""
    from irbis.kernels.inference import PRECISIONS

    parser.add_argument("--precision", default="fp32", choices=list(PRECISIONS), help=what)


def mode_option(parser: argparse.ArgumentParser) -> None:
    """``--mode``: what a write does when ``--output`` exists (Spark's save modes ``errorifexists`` and
    ``overwrite``)."""
    parser.add_argument("--mode", default="errorifexists", choices=["errorifexists", "overwrite"],
                        help="when --output exists")


def vectors_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--vectors``: how ``what`` are written, as arrays (``array``) or Spark ML vectors (``ml``)."""
    parser.add_argument("--vectors", default="array", choices=["array", "ml"],
                        help=f"how the {what} are written: array (array<float>, float32, which pandas, DuckDB, "
                        "Polars and vector stores read as lists) or ml (Spark ML vectors, for a Spark ML stage after)")


def vectors_as(frame: Any, column: str, kind: str) -> Any:
    """``frame`` with its Spark ML vector ``column`` as ``array<float>`` (``kind`` "array": what pandas, DuckDB,
    Polars and vector stores read as a list of float32), or as it is (``kind`` "ml": Spark ML's vector, which
    they see as a struct of type, size, indices and values)."""
    if kind == "ml":
        return frame
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    # a row without a vector (a text that is not UTF-8) stays null: vector_to_array refuses a null input
    return frame.withColumn(column, F.when(F.col(column).isNotNull(), vector_to_array(F.col(column), "float32")))


def text_frame(spark: Any, source: str, column: str) -> Any:
    """The texts of ``source``: a Parquet or CSV file (or folder of them) with a ``column``, or a folder of
    ``.txt`` files (one text per file, with its ``path``); see :func:`irbis.spark.tables.read_table`."""
    from irbis.spark.tables import read_table, table_kind

    frame = read_table(spark, source, table_kind(source), column)
    if column not in frame.columns:
        raise ValueError(f"{source} has no column {column!r} (its columns: {', '.join(frame.columns)}); "
                         "name the text column with --column")
    return frame
