"""The execution seam: a backend runs one function per rank and hands back the per-rank results.

In the spirit of Ray Train's backend split: the training code (the per-rank
function) knows nothing of threads, processes or Spark; a backend starts the
workers, gives each a :class:`Rank` (its rank, the world size, a joined
:class:`~irbis.train.comm.Communicator` and its share of the data), collects what
each returns, and shuts down. :mod:`irbis.train.backends.local` runs ranks as
threads; ``irbis.spark.training`` runs them as the tasks of a Spark barrier stage.

A rank function returns its result, or *returns* (does not raise) an exception
that every rank finds alike, such as bad input found by a collective check: the
backend raises it on the caller's side, with its class and message, and no
worker is retried for it. An exception the function *raises* fails the run (on
Spark, it fails the stage, which Spark may retry).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from irbis.train.comm import Communicator

T = TypeVar("T")


@dataclass
class Rank:
    """What a rank function receives: its rank, the world size, its communicator, its data, its device,
    and the host address it may bind servers to."""

    rank: int
    world_size: int
    comm: Communicator
    data: Any
    device: str = "cpu"
    host: str = "127.0.0.1"


RankFn = Callable[[Rank], Any]


class Backend(ABC, Generic[T]):
    """Start workers, run a function on every rank, collect the results, shut down.

    Examples
    --------
    >>> from irbis.train.backends.local import ThreadBackend
    >>> with ThreadBackend(2) as backend:
    ...     backend.run(lambda r: r.rank * 10, data=[None, None])
    [0, 10]
    """

    def __init__(self, num_workers: int) -> None:
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, found {num_workers!r}")
        self.num_workers = num_workers

    def start(self) -> None:
        """Acquire what the workers need (a rendezvous store, a pool); a no-op by default."""

    @abstractmethod
    def run(self, fn: RankFn, data: Any) -> list[T]:
        """Run ``fn`` on every rank over its share of ``data``; the results in rank order."""

    def shutdown(self) -> None:
        """Release what :meth:`start` acquired; a no-op by default."""

    def __enter__(self) -> Backend[T]:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def raise_returned(results: list[Any]) -> list[Any]:
    """Raise the first exception a rank returned (see the module doc); else return ``results``."""
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


__all__ = ["Backend", "Rank", "RankFn", "raise_returned"]
