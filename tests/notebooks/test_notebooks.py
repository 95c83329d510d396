"""The notebooks of ``examples/notebooks`` run from top to bottom without an error.

Each notebook is a jupytext percent file; it is converted with jupytext and executed by nbclient in a
fresh IPython kernel of this interpreter (a kernel spec written to a temporary folder, nothing registered
in Jupyter's own folders), in a temporary working folder, with a timeout per cell. Each kernel starts a
Spark driver of its own (``local[2]``) and stops it in its last cell. A failure names the notebook, the
cell (its index and first source line) and the error. Beyond running clean, each notebook must show what
it is about: the outputs checked in :data:`EXPECTED`.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.notebooks

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "examples" / "notebooks"
#: Seconds one cell may run: the slowest cell (the camera-trap ladder) takes about a minute and a half.
CELL_TIMEOUT_S = 300
#: Kernel name of the spec written for the run (never installed where Jupyter looks by default).
KERNEL = "irbis-notebook-tests"
#: Variables of the test run's own Spark that a kernel must not inherit: with them its ``get_spark`` would
#: look for a gateway or a Connect server instead of starting a driver; an inherited ``MPLBACKEND`` would
#: replace the kernel's inline figures.
NOT_INHERITED = ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE",
                 "SPARK_LOCAL_REMOTE", "MPLBACKEND")

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


class NotebookError(AssertionError):
    """A notebook's cell failed: names the notebook, the cell and the error."""


def test_every_notebook_is_checked():
    assert NAMES == sorted(EXPECTED), "each notebook of examples/notebooks needs its entry in EXPECTED"


def _kernel_manager(folder: Path):
    """A KernelManager for an IPython kernel on ``sys.executable``, from a spec in ``folder`` only."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = folder / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python {sys.version_info.major}.{sys.version_info.minor} (tests)",
        "language": "python"}))
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder)]))


def _texts(notebook, mime: str) -> list[str]:
    """Every output of ``notebook``'s cells of type ``mime`` (``text/plain`` includes printed text)."""
    found = []
    for cell in notebook.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and mime == "text/plain":
                found.append(out.get("text", ""))
            data = out.get("data", {})
            if mime in data:
                value = data[mime]
                found.append(value if isinstance(value, str) else json.dumps(value) if isinstance(value, dict)
                             else "".join(value))
    return found


def _describe(name: str, notebook, index: int | None, err: BaseException) -> str:
    """``err`` as a message that names the notebook, the failing cell and the error."""
    if index is None:
        return f"{name}.py: {type(err).__name__} before any cell ran: {err}"
    cell = notebook.cells[index]
    first = next((line for line in cell.source.splitlines() if line.strip()), "")
    error = next((out for out in cell.get("outputs", []) if out.get("output_type") == "error"), None)
    if error is not None:
        trace = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.get("traceback", [])))
        what = f"{error['ename']}: {error['evalue']}\n{trace[-3000:]}"
    else:
        what = f"{type(err).__name__}: {err}"
    return f"{name}.py: cell {index} ({first!r}) failed: {what}"


def run_notebook(path: Path, workdir: Path) -> tuple[object, float]:
    """Execute the jupytext file ``path`` in ``workdir``; the executed notebook and its seconds."""
    import jupytext
    from nbclient import NotebookClient

    name = path.stem
    notebook = jupytext.read(path)
    running: list[int] = []
    client = NotebookClient(notebook, km=_kernel_manager(workdir / ".kernel"), timeout=CELL_TIMEOUT_S,
                            startup_timeout=120, resources={"metadata": {"path": str(workdir)}},
                            on_cell_start=lambda cell, cell_index: running.append(cell_index))
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    start = time.perf_counter()
    try:
        client.execute(env=env)
    except Exception as err:
        raise NotebookError(_describe(name, notebook, running[-1] if running else None, err)) from err
    return notebook, time.perf_counter() - start


@pytest.mark.parametrize("name", NAMES)
def test_the_notebook_runs_and_shows_its_results(name, tmp_path, record_property):
    notebook, seconds = run_notebook(NOTEBOOKS / f"{name}.py", tmp_path)
    record_property("seconds", round(seconds, 1))
    print(f"{name}.py ran in {seconds:.1f} s")
    for mime, text in EXPECTED[name]:
        outputs = _texts(notebook, mime)
        assert outputs, f"{name}.py shows no {mime} output"
        if text is not None:
            assert any(text in out for out in outputs), f"{name}.py shows no {mime} output with {text!r}"
    shown = [out for out in _texts(notebook, "text/plain") if any(text in out for text in UNWANTED)]
    assert not shown, f"{name}.py shows {shown[0][:300]!r}"


def test_a_failing_cell_is_named_with_its_notebook_index_first_line_and_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("# %% [markdown]\n# A notebook that fails\n\n# %%\nx = 1\n\n"
                      "# %%\n\nratio = x / 0\nprint('never')\n\n# %%\nprint('never either')\n")
    with pytest.raises(NotebookError) as caught:
        run_notebook(broken, tmp_path)
    message = str(caught.value)
    assert message.startswith("broken.py: cell 2 ('ratio = x / 0') failed: ZeroDivisionError: division by zero")
