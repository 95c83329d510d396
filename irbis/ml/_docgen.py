"""Generate the API reference of the stages' Params.

The Params declared on each stage are the one source of truth: name, type (from the type
converter), default and doc. The documentation site's build (``mkdocs build``; its hook
docs/hooks/stages.py) renders every stage's table from :func:`render` each time, so nothing is
checked in. ``python -m irbis.ml._docgen`` prints the same text, for a look without building the site.

The vocabulary page (``docs/vocabulary.md``: each concept, its one Param name and meaning) is
:func:`vocabulary_page`, from :data:`irbis.ml.vocabulary.VOCABULARY`; it is checked in, and a test keeps it
equal to the code (``python -m irbis.ml._docgen vocabulary`` prints it).
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from typing import Any

from pyspark.ml import Estimator, Model, Transformer

TYPE_NAMES: dict[str, str] = {
    "toInt": "int", "toFloat": "float", "toString": "str", "toBoolean": "bool",
    "toListString": "list[str]", "toListInt": "list[int]", "toListFloat": "list[float]",
    "toListListFloat": "list[list[float]]", "toList": "list", "toVector": "vector",
    "toMatrix": "matrix", "identity": "any (JSON)",
}


def stage_classes() -> list[type]:
    """Every public stage class defined in ``irbis.ml`` and its modules, sorted by name."""
    import irbis.ml as package

    found: dict[str, type] = {}
    modules = [package] + [
        importlib.import_module(f"irbis.ml.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    ]
    # Names resolved on first use (irbis.ml's __getattr__) are not in vars() until then.
    exported = {name: getattr(package, name) for name in package.__all__}
    for module in modules:
        for name, obj in [*vars(module).items(), *exported.items()]:
            if (
                inspect.isclass(obj) and not name.startswith("_")
                and issubclass(obj, Transformer | Estimator)
                and obj.__module__.startswith("irbis.") and obj.__module__ != "irbis.ml.base"
                and not inspect.isabstract(obj)
            ):
                found[name] = obj
    return [found[n] for n in sorted(found)]


def _summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def _default(stage: Any, param: Any) -> str:
    if not stage.hasDefault(param):
        return "(no default)"
    value = stage.getOrDefault(param)
    text = repr(value).replace(stage.uid, "<uid>")
    if len(text) > 60:
        text = text[:57] + "..."
    return f"`{text}`".replace("|", "\\|")


def _kind(cls: type) -> str:
    if issubclass(cls, Estimator):
        return "estimator"
    return "fitted model" if issubclass(cls, Model) else "transformer"


def cell(text: str) -> str:
    """``text`` as one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def vocabulary_page() -> str:
    """The vocabulary (:mod:`irbis.ml.vocabulary`) as the Markdown page ``docs/vocabulary.md``."""
    from irbis.ml.vocabulary import VOCABULARY

    lines = [
        "# Vocabulary",
        "",
        "Generated from `irbis.ml.vocabulary` (`python -m irbis.ml._docgen vocabulary`); a test keeps this page",
        "up to date, and the conformance tests check every stage against it. Every stage that has one of these",
        "concepts gives its Param this name, with `setX` and `getX` as in Spark ML. The names of the last",
        "column are not Irbis Params; SynapseML's names work, as aliases, on the stages SynapseML also has (see",
        "[SynapseML names](synapseml.md)).",
        "",
        "| concept | Param | meaning | not called |",
        "|---|---|---|---|",
    ]
    for term in VOCABULARY:
        avoid = ", ".join(f"`{n}`" for n in term.avoid)
        lines.append(f"| {cell(term.concept)} | `{term.name}` | {cell(term.meaning)} | {avoid} |")
    lines += ["", "`rawPredictionCol`, `probabilityCol` and `predictionCol` mean what Spark ML's classifiers write,",
              "on every stage that has all three.", ""]
    return "\n".join(lines)


def render() -> str:
    """The Params reference of every stage, as Markdown."""
    lines = [
        "# Irbis API reference: Spark ML stages",
        "",
        "Generated from the stages' Params each time the site is built.",
        "Every stage works inside a `Pipeline`, saves with `stage.save(path)` and loads with "
        "`Class.load(path)`.",
        "",
    ]
    classes = stage_classes()
    lines += [f"- [{c.__name__}](#{c.__name__.lower()})" for c in classes] + [""]
    for cls in classes:
        stage = cls()
        lines += [f"## {cls.__name__}", "", f"`{cls.__module__}.{cls.__name__}` ({_kind(cls)})", ""]
        summary = _summary(cls)
        if summary:
            lines += [summary, ""]
        lines += ["| Param | type | default | doc |", "|---|---|---|---|"]
        for param in sorted(stage.params, key=lambda p: p.name):
            converter = getattr(param.typeConverter, "__name__", "identity")
            lines.append(f"| `{param.name}` | {TYPE_NAMES.get(converter, converter)} | {_default(stage, param)} "
                         f"| {cell(param.doc)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the reference (:func:`render`), or with the argument ``vocabulary`` the vocabulary page
    (:func:`vocabulary_page`), to stdout."""
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.write(vocabulary_page() if args[:1] == ["vocabulary"] else render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
