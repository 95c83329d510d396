"""Functions shipped to the executors that say so when the executors' Python lacks Irbis.

Spark pickles a job's Python function on the driver and unpickles it in each Python worker. A
function of Irbis refers to Irbis's modules, so on an executor whose Python lacks Irbis the
unpickling itself fails, before any of Irbis's code runs, and the user reads PySpark's stack
trace around ``ModuleNotFoundError: No module named 'irbis'``.

:func:`on_executors` wraps such a function in one that pickles as a call of a small loader that
refers to nothing but the standard library and the function's own bytes: Spark ships the loader by
value, and the Python worker, unpickling the job, runs it. The loader unpickles the function at once
(before PySpark's worker goes on to its own imports), and when that fails for a missing module it
raises a ``ModuleNotFoundError`` whose message names the module and the fix
(:func:`irbis.errors.executor_import_message`), which the failed job's error carries back to the
driver. The worker then holds the plain function: nothing is added per call.

Examples
--------
>>> import pickle
>>> from pyspark import cloudpickle
>>> fn = on_executors(len)
>>> pickle.loads(cloudpickle.dumps(fn))([1, 2, 3])
3
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from irbis.errors import executor_import_message

F = TypeVar("F", bound=Callable[..., Any])


def on_executors(fn: F) -> F:
    """``fn`` wrapped for a Spark task: the same calls and results, and a ``ModuleNotFoundError`` that
    names the fix (``irbis pack`` and ``get_spark(environment=...)``) where the executors' Python cannot
    import what ``fn`` needs."""
    return _Shipped(fn)  # type: ignore[return-value]


class _Shipped:
    """``fn`` on the driver; pickled, the loader's call that gives ``fn`` back in the Python worker."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", __name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        from pyspark import cloudpickle

        return _loader(), (cloudpickle.dumps(self.fn),)


def _loader() -> Callable[[bytes], Any]:
    """The function that unpickles a shipped function in the Python worker, naming the fix when a module
    is missing there. Nested, so cloudpickle ships it by value: it refers to builtins, the standard library
    and its cells only."""
    template = executor_import_message("{module}")  # the worker lacks irbis.errors: the text travels along

    def load(payload: bytes) -> Any:
        import pickle

        try:
            return pickle.loads(payload)
        except ModuleNotFoundError as err:
            name = (err.name or "").split(".")[0] or "irbis"
            raise ModuleNotFoundError(template.replace("'{module}'", repr(name)), name=err.name) from err

    return load


__all__ = ["on_executors"]
