"""irbis.spark.guard: a function shipped to executors whose Python lacks Irbis fails while the worker
unpickles it, with a message that names the missing module and the fix; where Irbis is present it is the
same function."""

from __future__ import annotations

import pickle
import subprocess
import sys
from functools import partial
from pathlib import Path

import py4j
import pyspark
from pyspark import cloudpickle

from irbis.errors import ExecutorImportError, executor_import_error, to_record
from irbis.spark.guard import on_executors


def test_the_shipped_function_is_the_same_function_where_irbis_is_installed():
    err = ValueError("bad")
    shipped = on_executors(partial(to_record, err))
    back = pickle.loads(cloudpickle.dumps(shipped))
    assert back() == to_record(err) == shipped()
    assert shipped.__name__ == "partial"  # named after the function, as pandas_udf asks


def test_a_python_without_irbis_names_the_module_and_the_fix(tmp_path):
    """A Python that has pyspark and py4j (as a Spark worker's path always does) but not Irbis unpickles
    the job's function: the error is raised by the loader, before anything else runs."""
    for package in (pyspark, py4j):  # the worker's path: its own pyspark and py4j, nothing else
        (tmp_path / package.__name__).symlink_to(Path(package.__file__).parent)
    (tmp_path / "job.pkl").write_bytes(cloudpickle.dumps(on_executors(partial(to_record, ValueError("x")))))
    code = ("import pickle, sys\n"
            f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "try:\n"
            f"    pickle.loads(open({str(tmp_path / 'job.pkl')!r}, 'rb').read())\n"
            "except ModuleNotFoundError as err:\n"
            "    print(err.name); print(err)\n")
    # -S: no site-packages; run from tmp_path so that the source tree is not on the path either.
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    name, message = done.stdout.split("\n", 1)
    assert name == "irbis"
    assert message.startswith("The Spark executors cannot import 'irbis'")
    assert "irbis pack --output irbis-env.pex" in message and "environment='irbis-env.pex'" in message
    # The driver finds the cause again in the failed job's text, as the training backend does.
    found = executor_import_error(RuntimeError(f"PythonException: ... ModuleNotFoundError: {message}"))
    assert isinstance(found, ExecutorImportError) and found.module == "irbis"


def test_another_missing_module_is_named_as_itself():
    found = executor_import_error(RuntimeError("... The Spark executors cannot import 'cv2' (ModuleNot..."))
    assert found is not None and found.module == "cv2" and "cannot import 'cv2'" in str(found)
    assert executor_import_error(RuntimeError("No module named 'numpy.foo'")) is None  # not Irbis's job


def test_executors_that_cannot_run_the_drivers_python_are_told_the_fix():
    """A driver in a virtual environment, executors on other hosts, nothing shipped: the JVM cannot start
    the Python worker at the driver's path. The fit's error names that Python, irbis pack and environment=."""
    jvm = ('org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 4 '
           'times, most recent failure: Lost task 0.3 in stage 3.0 (TID 9) (10.0.0.7 executor 1): '
           'java.io.IOException: Cannot run program "/home/ana/project/.venv/bin/python": error=2, No such '
           'file or directory\n\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)')
    found = executor_import_error(RuntimeError(jvm))
    assert isinstance(found, ExecutorImportError) and found.python == "/home/ana/project/.venv/bin/python"
    message = str(found)
    assert "cannot run the Python '/home/ana/project/.venv/bin/python'" in message
    assert "irbis pack --output irbis-env.pex" in message and "environment='irbis-env.pex'" in message
    assert "spark.pyspark.python" in message
    assert str(pickle.loads(pickle.dumps(found))) == message  # it crosses processes whole
    # Another program the JVM cannot run is no concern of the executors' Python... only a missing file is.
    assert executor_import_error(RuntimeError('Cannot run program "python3": error=13, Permission denied')) is None
