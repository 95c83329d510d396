"""MkDocs hook: the reference page of every Spark ML stage, generated from the code at build time.

For each stage that :func:`irbis.ml._docgen.stage_classes` finds, the page holds the class's docstring
and public methods (rendered by mkdocstrings) and its Param table, as :func:`irbis.ml._docgen.render`
writes it: name, type, default and doc of every Param, read from the stage itself. A stage or Param
added to the code is on the next build's page; nothing is checked in.

The hook also holds the reference to the public API: an object that a page renders (``::: name``)
without a docstring, and a public class or function of ``irbis`` or ``irbis.ml`` that no page renders,
are warnings, which fail ``mkdocs build --strict``.
"""
from __future__ import annotations

import inspect
import logging
import pkgutil
import re

from mkdocs.structure.files import File, Files

PAGE = "reference/stages.md"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)
log = logging.getLogger("mkdocs.plugins.irbis")
_rendered: set[str] = set()


def _tables(rendered: str) -> dict[str, list[str]]:
    """Each stage's Param table (its lines) from the text :func:`irbis.ml._docgen.render` gives."""
    tables: dict[str, list[str]] = {}
    for section in rendered.split("\n## ")[1:]:
        name, _, body = section.partition("\n")
        tables[name.strip()] = [line for line in body.splitlines() if line.startswith("|")]
    return tables


def stages_page() -> str:
    """The Markdown of the stages' reference page."""
    from irbis.ml import _docgen

    classes = _docgen.stage_classes()
    tables = _tables(_docgen.render())
    lines = [
        "# Stages and their Params",
        "",
        "Every Spark ML stage of Irbis: its docstring and methods, and the table of its Params (name, type,",
        "default and doc), generated from the code when the site is built. Every stage works inside a",
        "`Pipeline`, saves with `stage.save(path)` and loads with `Class.load(path)`; each Param has a",
        "`setX` setter and a `getX` getter, and is checked when it is set.",
        "",
        *[f"- [{cls.__name__}](#{cls.__name__.lower()})" for cls in classes],
        "",
    ]
    for cls in classes:
        name, path = cls.__name__, f"{cls.__module__}.{cls.__name__}"
        lines += [
            f"## {name}",
            "",
            f"`{path}` ({_docgen._kind(cls)})",
            "",
            f"::: {path}",
            "    options:",
            "      show_root_heading: false",
            "      show_root_toc_entry: false",
            "      heading_level: 3",
            # __init__ is made from the Params (irbis.ml.params.make_stage_init), which griffe's static
            # reading of the source does not see: the docstring's Parameters are the stage's Params
            "      docstring_options:",
            "        warn_unknown_params: false",
            "",
            f"### Params of {name}",
            "",
            *tables[name],
            "",
        ]
    return "\n".join(lines)


def on_files(files: Files, config) -> Files:
    """Add the generated stages page to the site's files."""
    files.append(File.generated(config, PAGE, content=stages_page()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Warn about a rendered object without a docstring; note what each page renders."""
    for name in DIRECTIVE.findall(markdown):
        _rendered.add(name)
        if not inspect.getdoc(pkgutil.resolve_name(name)):
            log.warning("%s renders %s, which has no docstring", page.file.src_uri, name)
    return markdown


def on_post_build(config) -> None:
    """Warn about a public class or function of ``irbis`` or ``irbis.ml`` that no page renders."""
    import irbis
    import irbis.ml

    rendered = [pkgutil.resolve_name(name) for name in _rendered]
    for package in (irbis, irbis.ml):
        for name in package.__all__:
            obj = getattr(package, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                path = f"{obj.__module__}.{obj.__qualname__}"
                # rendered by its own directive, or as a member of a module a page renders
                if not any(r is obj or (inspect.ismodule(r) and getattr(r, name, None) is obj) for r in rendered):
                    log.warning("%s.%s (%s) is in no page of the API reference", package.__name__, name, path)
    _rendered.clear()
