"""Running a jupytext notebook of ``examples/notebooks`` as a user would: converted with jupytext and executed by
nbclient in a fresh IPython kernel of this interpreter (a kernel spec written to a temporary folder, nothing
registered in Jupyter's own folders), in a working folder of the caller's, with a timeout per cell. Each kernel
starts a Spark driver of its own (``local[2]``). A failure names the notebook, the cell (its index and first
source line) and the error. Used by ``tests/notebooks`` and by the ``camera_trap_run`` fixture, whose one run of
the camera-trap notebook both the notebook's test and ``tests/spark/test_demo.py`` check.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


class NotebookError(AssertionError):
    """A notebook's cell failed: names the notebook, the cell and the error."""


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


def outputs_of(notebook, mime: str) -> list[str]:
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
