"""The notebooks of ``examples/notebooks`` run from top to bottom without an error.

Each notebook runs as a user would run it (:mod:`notebook_runner`: a fresh IPython kernel with a Spark driver
of its own, in a temporary working folder, a timeout per cell). A failure names the notebook, the cell (its
index and first source line) and the error. Beyond running clean, each notebook must show what it is about:
the outputs checked in :data:`EXPECTED`. The camera-trap notebook runs once per test run, in the
``camera_trap_run`` fixture, whose demo results ``tests/spark/test_demo.py`` checks too.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import os

import pytest

from notebook_runner import NOTEBOOKS, NotebookError, outputs_of, run_notebook

pytestmark = pytest.mark.notebooks

#: The MIME type of a Jupyter widget's output: tqdm's bar in a notebook when ipywidgets is installed.
WIDGET = "application/vnd.jupyter.widget-view+json"
#: Outputs each notebook must show: (MIME type, text the output holds, or None for any such output). The
#: long calls (the demo's ladder, the fits) show their progress bars as widgets.
EXPECTED = {
    "camera_trap": [("text/plain", "EN1+A+E"), ("image/png", None), ("text/html", "p_animal"), (WIDGET, None)],
    "fine_tuning": [("text/html", 'class="irbis-training-summary"'), ("image/png", None),
                    ("text/plain", "test accuracy"), (WIDGET, None)],
    "parameter_server": [("text/html", 'class="irbis-training-summary"'), ("image/png", None),
                         ("text/html", "staleness.mean"), (WIDGET, None)],
    "serving": [("text/plain", "HTTP answers equal Spark's: True"), ("text/plain", '"status"')],
    "lime_image": [("image/png", None), ("text/plain", "tabby cat")],
    "text_reviews": [("text/plain", "test accuracy"), ("image/png", None), ("text/plain", "words that weigh most")],
}

#: Text no notebook may show: tqdm's warning that it fell back on text bars for want of ipywidgets, and
#: torch.export.save's about weights that view one storage (harmless here, alarming in a notebook).
UNWANTED = ("IProgress not found", "TqdmWarning", "No complete tensor found")

NAMES = sorted(path.stem for path in NOTEBOOKS.glob("*.py"))
#: The notebooks executed in every run: the camera-trap one (the demo's test too, run once in the
#: ``camera_trap_run`` fixture) and the parameter-server one (a fit's HTML summary and widget progress bar in a
#: kernel, which no Spark test sees). The others repeat what Spark tests check (ImageClassifier's fit, HTTP
#: serving, ImageLIME, the text stages): :func:`test_every_notebook_uses_only_names_irbis_has` checks their
#: code against the library in milliseconds, and ``IRBIS_ALL_NOTEBOOKS=1`` executes them all.
EXECUTED = {"camera_trap", "parameter_server"}
RUN = NAMES if os.environ.get("IRBIS_ALL_NOTEBOOKS") == "1" else sorted(EXECUTED)


def test_every_notebook_is_checked():
    assert NAMES == sorted(EXPECTED), "each notebook of examples/notebooks needs its entry in EXPECTED"
    assert EXECUTED <= set(NAMES)


def _irbis_names(tree: ast.AST) -> list[tuple[str, str, list[str]]]:
    """(module, attribute, keyword arguments) for each Irbis name a notebook's code imports or reaches as
    ``irbis.X``; the keywords are those of the calls made to it (``irbis.X(a=...)``, or ``X(a=...)`` after
    ``from irbis... import X``)."""
    imported: dict[str, tuple[str, str]] = {}  # local name -> (module, attribute)
    found: list[tuple[str, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "irbis":
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
                found.append((node.module, alias.name, []))
        elif isinstance(node, ast.Import):
            found += [(a.name, "", []) for a in node.names if a.name.split(".")[0] == "irbis"]
    for node in ast.walk(tree):
        target = node.func if isinstance(node, ast.Call) else node
        keywords = [k.arg for k in node.keywords if k.arg] if isinstance(node, ast.Call) else []
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "irbis":
            found.append(("irbis", target.attr, keywords))
        elif isinstance(node, ast.Call) and isinstance(target, ast.Name) and target.id in imported:
            found.append((*imported[target.id], keywords))
    return found


@pytest.mark.parametrize("name", NAMES)
def test_every_notebook_uses_only_names_irbis_has(name):
    """Each notebook's code compiles, and every Irbis module, name and keyword argument it uses exists (a
    stage's keyword is one of its Params or of its ``__init__``): a renamed stage, function or Param breaks
    the notebook, and this test, without executing it."""
    import jupytext

    notebook = jupytext.read(NOTEBOOKS / f"{name}.py")
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    uses = _irbis_names(ast.parse(code, filename=f"{name}.py"))
    assert uses, f"{name}.py uses no Irbis name"
    for module, attribute, keywords in uses:
        found = importlib.import_module(module)
        if attribute:
            assert hasattr(found, attribute), f"{name}.py uses {module}.{attribute}, which does not exist"
            found = getattr(found, attribute)
        if keywords and callable(found):
            accepted = set(inspect.signature(found).parameters)
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(found).parameters.values()):
                continue
            params = {p.name for p in found().params} if isinstance(found, type) and hasattr(found, "params") else set()
            unknown = [k for k in keywords if k not in accepted | params]
            assert not unknown, f"{name}.py calls {module}.{attribute} with unknown keywords {unknown}"


@pytest.mark.parametrize("name", RUN)
def test_the_notebook_runs_and_shows_its_results(name, tmp_path, record_property, request):
    if name == "camera_trap":
        notebook, seconds, _ = request.getfixturevalue("camera_trap_run")
    else:
        notebook, seconds = run_notebook(NOTEBOOKS / f"{name}.py", tmp_path)
    record_property("seconds", round(seconds, 1))
    print(f"{name}.py ran in {seconds:.1f} s")
    for mime, text in EXPECTED[name]:
        outputs = outputs_of(notebook, mime)
        assert outputs, f"{name}.py shows no {mime} output"
        if text is not None:
            assert any(text in out for out in outputs), f"{name}.py shows no {mime} output with {text!r}"
    shown = [out for out in outputs_of(notebook, "text/plain") if any(text in out for text in UNWANTED)]
    assert not shown, f"{name}.py shows {shown[0][:300]!r}"


def test_a_failing_cell_is_named_with_its_notebook_index_first_line_and_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("# %% [markdown]\n# A notebook that fails\n\n# %%\nx = 1\n\n"
                      "# %%\n\nratio = x / 0\nprint('never')\n\n# %%\nprint('never either')\n")
    with pytest.raises(NotebookError) as caught:
        run_notebook(broken, tmp_path)
    message = str(caught.value)
    assert message.startswith("broken.py: cell 2 ('ratio = x / 0') failed: ZeroDivisionError: division by zero")
