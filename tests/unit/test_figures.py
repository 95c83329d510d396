"""Every measured figure that the README and the documentation quote is in the results file it comes from
(``benchmarks/results/``), and no results file there is superseded by a newer run of the same rows.

Where a figure is quoted (the convention the pages follow, stated at the top of ``docs/performance.md``):

- **The performance tables**: the table under the README's ``## Performance`` and the first table of
  ``docs/performance.md``. Every cell is checked. A row names the script that measured it (``inference.py``
  in backticks) and may name results files (``inference_effnet.txt``): its figures must be in the files it
  names, or, where it names none, in the results files of the scripts it names (``NAME.*`` and ``NAME_*.*``);
  never in another script's files.
- **Prose**: a paragraph (a block of lines between blank lines, outside code fences and tables) of the README
  or a docs page that cites a results file as a path (``benchmarks/results/FILE`` or ``results/FILE`` in
  backticks) quotes measurements: every figure in it must be in the files it cites. A paragraph that states a
  rate (a number followed by img/s, images/s, samples/s, rows/s, inputs/s or req/s) must cite one.
- **References**: every results file the pages or the tests cite exists; in the README's Performance section
  and on ``docs/performance.md`` a bare file name in backticks (``cluster.png``) is a results file too.
- **How each run was made**: a results file made by a benchmark (its first line ``# benchmarks/NAME.py``)
  records the command, the commit, the date, the machine's cores and the load average before and after, and the
  script's measuring-code version (``benchmarks/provenance.py``): it is outdated when the script declares
  another ``MEASURING_CODE`` now (the measurement changed since the run), and must be made again.
- **Superseded runs**: a results file is stale when a newer run of the same script (the script named on its
  first line, ``# benchmarks/NAME.py``, dated ``YYYY-MM-DD HH:MM`` in its header) on the same kind of machine
  (its header's ``# machine:`` cores and CPU instructions) holds a table row with the same label under the
  same ``## `` section; no stale file may be kept. A run on another CPU is kept beside it.

Which tokens count as figures (the extraction rule):

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
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import measuring_code  # noqa: E402  (benchmarks/: the one reader of a script's version)

RESULTS = Path("benchmarks") / "results"
TEXT_SUFFIXES = {".txt", ".json", ".csv", ".md"}
UNITS = r"(?:img/s|images/s|samples/s|rows/s|inputs/s|req/s|MiB|GiB|KiB|ms|s)"
FIGURE = re.compile(
    r"(?<![\w.])(?<!\d,)(?:"
    r"\d+(?:\.\d+)?x(?![\w])"  # a ratio: 1.53x, 28x
    r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?"  # thousands separators: 23,098
    r"|\d+\.\d+"  # a decimal point: 142.5
    rf"|\d+(?=\s{UNITS}(?![\w/]))"  # a whole number with a unit: 369 img/s
    r")(?!\d|[.,]\d)")
#: A rate: a number and a unit per second; a paragraph stating one quotes a measurement.
RATE = re.compile(r"\d[\d,.]*(?:e[+-]?\d+)?\s(?:img|images|samples|rows|inputs|req)/s\b")
#: A results file cited as a path, in backticks: `benchmarks/results/x.txt` or `results/x.txt`.
CITED = re.compile(r"`(?:benchmarks/)?results/([\w.-]+\.\w+)`")
#: A bare file name in backticks: a results file in the performance tables and on the performance page.
BARE = re.compile(r"`([\w-]+\.(?:txt|json|png|csv))`")
SCRIPT = re.compile(r"`(\w+)\.py`")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}")


def figures(text: str) -> list[str]:
    """The figures of a table cell or a paragraph, by the module's extraction rule."""
    return FIGURE.findall(re.sub(r"`[^`]*`", " ", text))


def backed(figure: str, text: str) -> bool:
    """Whether ``text`` (a results file) holds ``figure`` as written or without thousands separators."""
    forms = {figure, figure.replace(",", "")}
    return any(re.search(rf"(?<![\d.,]){re.escape(f)}(?!\d|[.,]\d)", text) for f in forms)


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


def readme_performance(readme: str) -> str:
    """The README's ``## Performance`` section."""
    return readme.split("\n## Performance", 1)[1].split("\n## ", 1)[0]


def performance_tables(root: Path) -> dict[str, list[list[str]]]:
    """The rows of the two performance tables, by page."""
    return {"README.md": table_rows(readme_performance((root / "README.md").read_text())),
            "docs/performance.md": table_rows((root / "docs" / "performance.md").read_text().split("\n## ", 1)[0])}


def pages(root: Path) -> dict[str, str]:
    """The README and every docs page, by path."""
    found = {"README.md": (root / "README.md").read_text()}
    found.update({p.relative_to(root).as_posix(): p.read_text() for p in sorted((root / "docs").glob("*.md"))})
    return found


def paragraphs(page: str) -> list[str]:
    """The blocks of ``page`` between blank lines, less code fences and table lines."""
    page = re.sub(r"^```.*?^```[^\n]*$", "", page, flags=re.S | re.M)
    blocks = [[line for line in block.splitlines() if not line.lstrip().startswith("|")]
              for block in re.split(r"\n\s*\n", page)]
    return ["\n".join(b) for b in blocks if b]


def results_files(root: Path) -> dict[str, str]:
    """The text of each readable results file, by name."""
    return {p.name: p.read_text(errors="replace") for p in sorted((root / RESULTS).iterdir())
            if p.is_file() and p.suffix in TEXT_SUFFIXES}


def script_files(script: str, names) -> list[str]:
    """The results files of ``script`` (its stem): ``NAME.*`` and ``NAME_*.*``."""
    return [n for n in names if n.split(".", 1)[0] == script or n.startswith(script + "_")]


@dataclass
class Problem:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def unbacked_table_figures(root: Path) -> list[Problem]:
    """Each figure of the performance tables that its row's results files do not hold."""
    files = results_files(root)
    problems = []
    for page, rows in performance_tables(root).items():
        if not rows:
            problems.append(Problem(page, "no performance table"))
        for row in rows:
            text = " | ".join(row)
            named = [n for n in BARE.findall(text) if n in files]
            scripts = SCRIPT.findall(row[0])
            sources = named or [n for s in scripts for n in script_files(s, files)]
            where = f"{page}, row {row[0][:50]!r}"
            if not sources:
                problems.append(Problem(where, f"names no results file and no script with one ({scripts})"))
                continue
            held = "\n".join(files[n] for n in sources)
            problems += [Problem(where, f"{f} is not in {', '.join(sources)}")
                         for cell in row for f in figures(cell) if not backed(f, held)]
    return problems


def unbacked_prose_figures(root: Path) -> list[Problem]:
    """Each figure of a paragraph that cites results files and that they do not hold, and each paragraph
    that states a rate and cites none."""
    files = results_files(root)
    problems = []
    for page, text in pages(root).items():
        for para in paragraphs(text):
            cited = [n for n in CITED.findall(para) if n in files]
            where = f"{page}, {' '.join(para.split())[:60]!r}"
            if not cited:
                if RATE.search(re.sub(r"`[^`]*`", " ", para)):
                    problems.append(Problem(where, "states a rate and cites no results file"))
                continue
            held = "\n".join(files[n] for n in cited)
            problems += [Problem(where, f"{f} is not in {', '.join(cited)}")
                         for f in figures(para) if not backed(f, held)]
    return problems


def missing_results_files(root: Path) -> list[Problem]:
    """Each results file that a page or a test cites and that is not there."""
    kept = {p.name for p in (root / RESULTS).iterdir()}
    cites = {page: set(CITED.findall(text)) for page, text in pages(root).items()}
    cites["README.md"] |= set(BARE.findall(readme_performance(pages(root)["README.md"])))
    cites["docs/performance.md"] |= set(BARE.findall(pages(root)["docs/performance.md"]))
    for test in sorted((root / "tests").rglob("*.py")):
        if test.name != Path(__file__).name:
            cites[test.relative_to(root).as_posix()] = set(CITED.findall(test.read_text().replace("``", "`")))
    return [Problem(where, f"cites {name}, which is not in {RESULTS.as_posix()}")
            for where, names in cites.items() for name in sorted(names - kept)]


def header(text: str) -> tuple[str | None, str | None]:
    """The script a results file names on its first line, and the date in its first lines."""
    lines = text.splitlines()
    script = re.match(r"#\s*benchmarks/(\w+)\.py", lines[0]) if lines else None
    date = DATE.search("\n".join(lines[:5]))
    return (script.group(1) if script else None), (date.group(0).replace("T", " ") if date else None)


def machine(text: str) -> str:
    """The kind of machine a results file's header names: its cores and CPU instructions (``x86_64, 2 cores
    (AVX-512, VNNI)``), the ``# machine:`` line up to the first ``;``; empty where the header has none."""
    found = re.search(r"^# machine: ([^;\n]*)", text, re.M)
    return found.group(1).strip() if found else ""


def row_labels(text: str) -> set[tuple[str, str]]:
    """(section, first cell) of each markdown table body row of a results file."""
    labels, section = set(), ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("|") and not set(line) <= set("|-: "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            labels.add((section, cells[0]))
    return labels


def stale_results_files(root: Path) -> list[Problem]:
    """Each results file that a newer run of the same script on the same kind of machine supersedes: it holds a
    row (same section, same label) that the newer run holds too."""
    runs = []
    for name, text in results_files(root).items():
        script, date = header(text)
        if script and date:
            runs.append(((script, machine(text)), date, name, row_labels(text)))
    return [Problem(f"{RESULTS.as_posix()}/{old}", f"superseded by {new} ({new_date} against {old_date}): "
                    f"{len(old_rows & new_rows)} rows run again there")
            for script, old_date, old, old_rows in runs for other, new_date, new, new_rows in runs
            if other == script and new_date > old_date and old_rows & new_rows]


#: What a benchmark's results file must record in its first lines (``benchmarks/provenance.py``'s header). A run
#: made before that header says "not recorded by the run" where it recorded nothing.
HEADER_FIELDS = {"the command": re.compile(r"^# command: \S", re.M),
                 "the commit": re.compile(r"^# commit: \S", re.M),
                 "the date": DATE,
                 "the machine's cores": re.compile(r"\b\d+ (?:CPU )?cores\b|^# cores: not recorded", re.M),
                 "the load average before and after": re.compile(r"load average.*before.*after")}
MEASURED_BY = re.compile(r"^# commit: .*\bmeasuring code: (\S+)$", re.M)
HEADER_LINES = 12


def outdated_results_files(root: Path) -> list[Problem]:
    """Each results file made by a benchmark that does not record how it was made, or that an older version
    of its script's measuring code made (its script's ``MEASURING_CODE`` differs now)."""
    problems = []
    for name, text in results_files(root).items():
        script, _ = header(text)
        if not script or not name.endswith(".txt"):
            continue
        where = f"{RESULTS.as_posix()}/{name}"
        head = "\n".join(text.splitlines()[:HEADER_LINES])
        problems += [Problem(where, f"does not record {what} (benchmarks/provenance.py's header)")
                     for what, pattern in HEADER_FIELDS.items() if not pattern.search(head)]
        source = root / "benchmarks" / f"{script}.py"
        if not source.exists():
            problems.append(Problem(where, f"made by benchmarks/{script}.py, which is gone"))
            continue
        try:
            declared = measuring_code(source)
        except LookupError:
            problems.append(Problem(f"benchmarks/{script}.py", "declares no MEASURING_CODE"))
            continue
        recorded = MEASURED_BY.search(head)
        if recorded is None:
            problems.append(Problem(where, "records no measuring code"))
        elif recorded.group(1) != declared:
            problems.append(Problem(where, f"made by measuring code {recorded.group(1)} of benchmarks/{script}.py, "
                                           f"which is at {declared} now: run it again"))
    return problems


# -- the rules, on small cases ------------------------------------------------------------------------
def test_the_extraction_rule_takes_figures_and_leaves_settings():
    cell = ("`sync` 23,098 end to end (3.7x), at 128 clients 0.935 over 2 workers; 224x224 images, "
            "RSS 496 MiB, p50 0.48 ms, 369 img/s and 6 ms; `openCostInBytes` 64; at 0.95.")
    assert figures(cell) == ["23,098", "3.7x", "0.935", "496", "0.48", "369", "6", "0.95"]


def test_a_figure_is_backed_only_as_a_whole_number():
    assert backed("23,098", "sync 23098 samples/s") and backed("23,098", "sync 23,098 samples/s")
    assert backed("1.53x", "ImageLIME 1.53x lime")
    assert not backed("142.5", "1142.5 img/s") and not backed("142.5", "142.53 img/s")
    assert not backed("3.7x", "13.7x") and not backed("369", "369.2 img/s") and not backed("369", "0.369")


def test_paragraphs_leave_out_code_and_tables():
    page = "A `results/a.txt` 1.5 img/s.\n\n```python\nx = 2.5\n\n```\n\n| 3.5 |\n|---|\nafter 4.5\n"
    assert paragraphs(page) == ["A `results/a.txt` 1.5 img/s.", "after 4.5"]


# -- the project's pages and results --------------------------------------------------------------------
def test_every_figure_of_the_performance_tables_is_in_its_rows_results_files():
    problems = unbacked_table_figures(ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_every_figure_of_the_prose_is_in_the_results_file_it_cites():
    problems = unbacked_prose_figures(ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_every_cited_results_file_exists():
    problems = missing_results_files(ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_every_results_file_records_how_it_was_made_by_its_scripts_current_measuring_code():
    problems = outdated_results_files(ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_no_results_file_is_superseded_by_a_newer_run():
    problems = stale_results_files(ROOT)
    assert not problems, "\n".join(map(str, problems))


# -- the check fails where it should: planted cases on a copy --------------------------------------------
@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The README, the docs pages and the results files' text, copied."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    (tmp_path / "docs").mkdir()
    for page in (ROOT / "docs").glob("*.md"):
        shutil.copy(page, tmp_path / "docs" / page.name)
    (tmp_path / RESULTS).mkdir(parents=True)
    for result in (ROOT / RESULTS).iterdir():
        if result.is_file():  # charts too: the pages cite them, and they must exist
            shutil.copy(result, tmp_path / RESULTS / result.name)
    (tmp_path / "tests").mkdir()
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("results", "__pycache__"))
    return tmp_path


def planted(check, root: Path, plant) -> list[str]:
    """What ``check`` finds on ``root`` after ``plant(root)`` that it did not find before."""
    before = {str(p) for p in check(root)}
    plant(root)
    return [str(p) for p in check(root) if str(p) not in before]


def test_a_planted_stale_results_file_fails_the_check(copy: Path):
    newest = (copy / RESULTS / "explain.txt").read_text()
    script, date = header(newest)
    assert script == "explain" and date

    def plant(root: Path) -> None:
        (root / RESULTS / "explain_old.txt").write_text(newest.replace(date, "2020-01-01 00:00", 1))

    found = planted(stale_results_files, copy, plant)
    assert len(found) == 1 and found[0].startswith(f"{RESULTS.as_posix()}/explain_old.txt: superseded by explain.txt")


def test_an_older_run_on_another_cpu_is_kept_beside_the_newer_one(copy: Path):
    newest = (copy / RESULTS / "explain.txt").read_text()
    script, date = header(newest)
    kind = machine(newest)
    assert kind and date

    def plant(root: Path) -> None:
        other = newest.replace(date, "2020-01-01 00:00", 1).replace(kind, "x86_64, 2 cores (AVX-512, AMX-BF16)", 1)
        (root / RESULTS / "explain_other_cpu.txt").write_text(other)

    assert planted(stale_results_files, copy, plant) == []


def test_a_run_of_an_older_measuring_code_fails_the_check(copy: Path):
    """A script whose measurement changed (its MEASURING_CODE bumped) voids its results file; a rename in the
    script does not."""
    script = copy / "benchmarks" / "explain.py"
    found = planted(outdated_results_files, copy,
                    lambda root: script.write_text(script.read_text().replace("def main(", "def run_main(")
                                                   .replace("main()", "run_main()")))
    assert found == []
    declared = re.search(r"^MEASURING_CODE = (\d+)", script.read_text(), re.M)
    assert declared, "explain.py declares no MEASURING_CODE: the planted case needs updating"
    bumped = int(declared.group(1)) + 1
    found = planted(outdated_results_files, copy, lambda root: _replace(
        script, declared.group(0), f"MEASURING_CODE = {bumped}"))
    assert found == [f"{RESULTS.as_posix()}/explain.txt: made by measuring code {declared.group(1)} of "
                     f"benchmarks/explain.py, which is at {bumped} now: run it again"]


def test_a_results_file_that_does_not_say_how_it_was_made_fails_the_check(copy: Path):
    found = planted(outdated_results_files, copy, lambda root: _replace(
        root / RESULTS / "explain.txt", "# command: ", "# "))
    assert found == [f"{RESULTS.as_posix()}/explain.txt: does not record the command (benchmarks/provenance.py's "
                     "header)"]


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} is not in {path.name}: the planted case needs updating"
    path.write_text(text.replace(old, new, 1))


def test_a_planted_figure_in_a_table_fails_the_check(copy: Path):
    page = copy / "docs" / "performance.md"
    found = planted(unbacked_table_figures, copy,
                    lambda root: _replace(page, "(ONNX Runtime) 84.1", "(ONNX Runtime) 85.1"))
    assert len(found) == 1 and found[0].startswith("docs/performance.md, row 'EfficientNet-Lite0")
    assert found[0].endswith("85.1 is not in inference_effnet.txt")


def test_a_figure_from_another_scripts_file_fails_the_check(copy: Path):
    """Rows are checked against their own files: the ResNet-50 run's 54.5 does not back the
    EfficientNet-Lite0 row, though a results file holds it."""
    assert backed("54.5", (copy / RESULTS / "inference_resnet50.txt").read_text())
    found = planted(unbacked_table_figures, copy,
                    lambda root: _replace(root / "README.md", '`engine="auto"`: 84.1', '`engine="auto"`: 54.5'))
    assert len(found) == 1 and "54.5 is not in inference_effnet.txt" in found[0], found


def test_a_planted_figure_in_prose_fails_the_check(copy: Path):
    def plant(root: Path) -> None:
        _replace(root / "docs" / "images.md", "reached 96.9 on", "reached 97.9 on")
        (root / "docs" / "planted.md").write_text("# Planted\n\nIt featurized 192 JPEGs at 84 img/s in 24 tasks.\n")

    found = planted(unbacked_prose_figures, copy, plant)
    assert len(found) == 2
    assert any(f.startswith("docs/images.md") and f.endswith("97.9 is not in train_images_frozen.txt") for f in found)
    assert any(f.startswith("docs/planted.md") and f.endswith("states a rate and cites no results file") for f in found)


def test_a_cited_results_file_that_is_gone_fails_the_check(copy: Path):
    found = planted(missing_results_files, copy, lambda root: (root / RESULTS / "train_images.txt").unlink())
    assert {f.split(":")[0] for f in found} >= {"README.md", "docs/performance.md", "docs/images.md"}
    assert all(f.endswith("cites train_images.txt, which is not in benchmarks/results") for f in found)
