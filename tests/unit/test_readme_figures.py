"""The README's Performance table, and the table of the documentation site's Performance page
(``docs/performance.md``), quote results files only: every measured figure they state appears in a file
under ``benchmarks/results/``.

Which tokens of a cell count as figures (the extraction rule):

- every column: the baseline and Irbis columns, and the job column too, which mostly states settings
  (``1,000 JPEGs``) but may state a measured figure (the load generator's own ceiling);
- text inside backticks is code (a script or Param name), never a figure;
- a figure is a number with a decimal point (``142.5``, ``0.935``), a number with thousands separators
  (``23,098``), a ratio ending in ``x`` (``1.53x``, ``28x``, but not the size ``224x224``), or a whole
  number followed by a unit of measure (``369 img/s``, ``496 MiB``, ``6 ms``); other whole numbers are
  settings (``2 workers``, ``at 128`` clients) and are not checked.

A figure is backed when a results file holds it as written, or with its thousands separators removed
(``23,098`` is backed by ``23098``), as a whole number: no digit, decimal point or separator joins it on
either side (``142.5`` is not backed by ``1142.5`` or ``142.53``, ``369`` not by ``369.2``).
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNITS = r"(?:img/s|images/s|samples/s|rows/s|req/s|MiB|GiB|KiB|ms|s)"
FIGURE = re.compile(
    r"(?<![\w.])(?<!\d,)(?:"
    r"\d+(?:\.\d+)?x(?![\w])"  # a ratio: 1.53x, 28x
    r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?"  # thousands separators: 23,098
    r"|\d+\.\d+"  # a decimal point: 142.5
    rf"|\d+(?=\s{UNITS}(?![\w/]))"  # a whole number with a unit: 369 img/s
    r")(?!\d|[.,]\d)")


def figures(cell: str) -> list[str]:
    """The figures of one table cell, by the module's extraction rule."""
    return FIGURE.findall(re.sub(r"`[^`]*`", " ", cell))


def table_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the first table in ``section``."""
    lines = section.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))])
    return rows[2:]


def performance_rows(readme: str) -> list[list[str]]:
    """The cells of each body row of the table under ``## Performance``."""
    return table_rows(readme.split("\n## Performance", 1)[1].split("\n## ", 1)[0])


def site_performance_rows(page: str) -> list[list[str]]:
    """The cells of each body row of the site's Performance table: the first table of the page, above its
    first ``## `` section (the sections below it say how to rerun the scripts)."""
    return table_rows(page.split("\n## ", 1)[0])


def backed(figure: str, text: str) -> bool:
    """Whether ``text`` (a results file) holds ``figure`` as written or without thousands separators."""
    forms = {figure, figure.replace(",", "")}
    return any(re.search(rf"(?<![\d.,]){re.escape(f)}(?!\d|[.,]\d)", text) for f in forms)


def test_the_extraction_rule_takes_figures_and_leaves_settings():
    cell = ("`sync` 23,098 end to end (3.7x), at 128 clients 0.935 over 2 workers; 224x224 images, "
            "RSS 496 MiB, p50 0.48 ms, 369 img/s and 6 ms; `openCostInBytes` 64; at 0.95.")
    assert figures(cell) == ["23,098", "3.7x", "0.935", "496", "0.48", "369", "6", "0.95"]


def test_a_figure_is_backed_only_as_a_whole_number():
    assert backed("23,098", "sync 23098 samples/s") and backed("23,098", "sync 23,098 samples/s")
    assert backed("1.53x", "ImageLIME 1.53x lime")
    assert not backed("142.5", "1142.5 img/s") and not backed("142.5", "142.53 img/s")
    assert not backed("3.7x", "13.7x") and not backed("369", "369.2 img/s") and not backed("369", "0.369")


def results_text() -> str:
    """Every results file under ``benchmarks/results/``, joined."""
    return "\n".join(p.read_text(errors="replace") for p in sorted((ROOT / "benchmarks" / "results").iterdir())
                     if p.is_file() and p.suffix in {".txt", ".json", ".csv", ".md"})


def test_every_figure_of_the_performance_table_is_in_a_results_file():
    rows = performance_rows((ROOT / "README.md").read_text())
    assert rows and all(len(r) == 3 for r in rows), "the Performance table has three columns"
    results = results_text()
    missing = [(row[0][:40], f) for row in rows for cell in row for f in figures(cell) if not backed(f, results)]
    assert not missing, f"{len(missing)} figures of the README's Performance table are in no results file: {missing}"


def test_every_figure_of_the_site_performance_table_is_in_a_results_file():
    rows = site_performance_rows((ROOT / "docs" / "performance.md").read_text())
    assert rows and all(len(r) == 3 for r in rows), "the site's Performance table has three columns"
    results = results_text()
    missing = [(row[0][:40], f) for row in rows for cell in row for f in figures(cell) if not backed(f, results)]
    assert not missing, f"{len(missing)} figures of docs/performance.md's table are in no results file: {missing}"
