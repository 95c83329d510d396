"""Errors shared by every layer: the missing-column error, a Param's refused value, and error records
that cross processes.

A worker of a Spark task cannot raise into the driver: what crosses is a string. An
error crosses as a JSON record (its type name, its message and the fields it knows,
such as ``column``, ``expected`` and ``found``), and the driver raises the same
exception class with the worker's message intact. Pure: no pyspark, no torch.

Examples
--------
>>> err = ColumnNotFoundError("Stage", "x", ["a", "b"])
>>> str(err)
"Stage: input column 'x' not found; the DataFrame has columns ['a', 'b']."
>>> back = from_record(to_record(err))
>>> type(back).__name__, str(back) == str(err), back.column
('ColumnNotFoundError', True, 'x')
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


class ColumnNotFoundError(ValueError):
    """A stage's input column is missing from the DataFrame.

    Parameters
    ----------
    stage : str
        The stage (or estimator) that needs the column.
    column : str
        The missing column.
    columns : iterable of str
        The columns the DataFrame has (kept as ``found``).
    role : str, default "input column"
        What the column is to the stage, e.g. ``"featuresCol"``.
    """

    def __init__(self, stage: str, column: str, columns: Iterable[str], role: str = "input column") -> None:
        self.stage, self.column, self.found, self.role = stage, column, list(columns), role
        super().__init__(f"{stage}: {role} {column!r} not found; the DataFrame has columns {self.found}.")
        self.fields = {"stage": stage, "column": column, "found": self.found, "role": role}

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.stage, self.column, self.found, self.role)


class ParamValueError(ValueError):
    """A Param was set to a value outside its allowed set or range (raised at set time, on the driver).

    Parameters
    ----------
    name : str
        The Param.
    value : Any
        The value refused.
    allowed : str
        What the Param accepts, in words (e.g. ``"one of 'cpu', 'cuda'"``).
    """

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"Param {name}={value!r} is not allowed; expected {allowed}.")


def require_columns(stage: str, columns: Iterable[str], wanted: Iterable[str], role: str = "input column") -> None:
    """Raise :class:`ColumnNotFoundError` for the first of ``wanted`` that is not in ``columns``."""
    names = list(columns)
    for col in wanted:
        if col not in names:
            raise ColumnNotFoundError(stage, col, names, role)


def with_fields(err: BaseException, **fields: Any) -> BaseException:
    """Attach JSON-able fields (``column``, ``expected``, ``found``, ...) to ``err``; return it."""
    err.fields = {**getattr(err, "fields", {}), **fields}  # type: ignore[attr-defined]
    return err


class NonFiniteLossError(ValueError):
    """Training produced a NaN or infinite loss (the message names the epoch, the step and the data's part)."""


class NoKernelError(ValueError):
    """A stage without a batch kernel: it runs inside a Spark job only, not in serving, LIME or ``fuse``.

    Parameters
    ----------
    classes : str or iterable of str
        The class names of the stages that have no kernel (``cls`` holds the first).
    message : str
        What has no kernel, and what to do instead.
    """

    def __init__(self, classes: str | Iterable[str], message: str) -> None:
        self.classes = [classes] if isinstance(classes, str) else list(classes)
        self.cls = self.classes[0] if self.classes else ""
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.classes, str(self))


class MissingExtraError(ImportError):
    """A stage, function or command needs an optional extra of Irbis that is not installed (the extras and
    their modules: :mod:`irbis.extras`). The message names who needs it, the missing modules and the fix.

    Parameters
    ----------
    what : str or None
        The stage, function or command that needs the extra (None: a module of the extra was used).
    extra : str
        The extra, e.g. ``"images"``.
    modules : iterable of str
        Its modules that are not installed (``name`` holds the first).
    """

    def __init__(self, what: str | None, extra: str, modules: Iterable[str]) -> None:
        self.what, self.extra, self.modules = what, extra, list(modules)
        names = ", ".join(self.modules)
        needs = f"{what} needs" if what else "This needs"
        super().__init__(f"{needs} the optional extra irbis[{extra}] ({names} not installed): "
                         f"pip install 'irbis[{extra}]'", name=self.modules[0] if self.modules else None)
        self.fields = {"what": what, "extra": extra, "modules": self.modules}

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.what, self.extra, self.modules)


def executor_import_message(module: str = "irbis") -> str:
    """What a Spark job says when the executors' Python cannot import ``module``: the cause and the fix.
    It quotes Python's own ``No module named '...'``, which :func:`executor_import_error` finds again in a
    failed job's text on the driver."""
    return (f"The Spark executors cannot import {module!r} (ModuleNotFoundError: No module named {module!r} in "
            f"their Python workers): the executors' Python is not the environment Irbis is installed in. "
            f"Ship this environment with the application: `irbis pack --output irbis-env.pex`, then "
            f"irbis.get_spark(master, environment='irbis-env.pex'), which puts the file in spark.files and "
            f"points spark.pyspark.python (PYSPARK_PYTHON) at it (a packed virtual environment goes through "
            f"spark.archives instead); or install irbis and its dependencies (torch) into the executors' Python.")


def executor_python_message(python: str) -> str:
    """What a Spark job says when the executors cannot start their Python worker at all: ``python`` (the
    driver's own interpreter by default, ``PYSPARK_PYTHON``) does not exist on their hosts."""
    return (f"The Spark executors cannot run the Python {python!r} (the JVM's \"Cannot run program\": No such "
            f"file or directory): PYSPARK_PYTHON names the driver's Python, which their hosts do not have. Ship "
            f"this environment with the application: `irbis pack --output irbis-env.pex`, then "
            f"irbis.get_spark(master, environment='irbis-env.pex'); or install irbis and its dependencies "
            f"(torch) into a Python on every executor host and name it with "
            f"irbis.get_spark(master, **{{'spark.pyspark.python': '/path/to/python'}}).")


class ExecutorImportError(RuntimeError):
    """The executors' Python cannot import Irbis (or one of its modules): a Spark job of Irbis failed on
    them with ``ModuleNotFoundError``, or could not start their Python at all. The message names the
    module, or the Python, and the fix (:func:`executor_import_message`, :func:`executor_python_message`).

    Parameters
    ----------
    module : str
        The module the executors could not import, e.g. ``"irbis"``.
    python : str, optional
        The Python program the executors could not run (then it is this, not ``module``, that is missing).
    """

    def __init__(self, module: str = "irbis", python: str | None = None) -> None:
        self.module, self.python = module, python
        super().__init__(executor_import_message(module) if python is None else executor_python_message(python))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.module, self.python)


def executor_import_error(err: BaseException) -> ExecutorImportError | None:
    """The :class:`ExecutorImportError` that ``err`` (a Spark job's error as the driver sees it: a
    ``PythonException`` or ``Py4JJavaError`` whose text holds the executor's traceback) stands for, or
    ``None`` when it is no failed import of Irbis and no missing executor Python."""
    import re

    text = str(err)
    missing = re.search(r'Cannot run program "([^"]+)"[^\n]*No such file or directory', text)
    if missing:
        return ExecutorImportError(python=missing.group(1))
    found = (re.search(r"The Spark executors cannot import '([\w.]+)'", text)  # irbis.spark.guard's message
             or re.search(r"No module named '(irbis(?:\.[\w.]+)?)'", text))
    return ExecutorImportError(found.group(1)) if found else None


#: Exception classes a record may name; any other name is raised as a RuntimeError.
ERROR_TYPES: dict[str, type[BaseException]] = {
    cls.__name__: cls for cls in (ValueError, TypeError, ColumnNotFoundError, RuntimeError, NonFiniteLossError,
                                 MissingExtraError)
}


def to_record(err: BaseException) -> str:
    """The JSON record of ``err``: ``{"type", "message", "fields"}``."""
    return json.dumps({"type": type(err).__name__, "message": str(err),
                       "fields": getattr(err, "fields", {})}, default=str)


def from_record(record: str) -> BaseException:
    """The exception that :func:`to_record` described, of the same class and with the same message."""
    data = json.loads(record)
    cls = ERROR_TYPES.get(data["type"])
    if cls is None:
        return RuntimeError(f"{data['type']}: {data['message']}")
    err = cls.__new__(cls)
    BaseException.__init__(err, data["message"])
    for key, value in data.get("fields", {}).items():
        setattr(err, key, value)
    return with_fields(err, **data.get("fields", {}))
