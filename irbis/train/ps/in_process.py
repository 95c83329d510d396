"""The parameter server inside one process, for workers that are threads: deterministic lockstep.

:class:`LocalHub` holds the shards; each worker thread talks to it through a
:class:`LocalClient`, which has the same methods as
:class:`~irbis.train.ps.transport.PSClient`. Requests are served in a fixed
round-robin of the ranks (rank 0's k-th request, then rank 1's, ...), so the
asynchronous strategies follow the same schedule, with the same staleness, on
every run: the thread backend is where their update rules are compared exactly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from irbis.train.ps.shard import REJECTED, ShardState

ABORT_POLL_S = 0.1  # how often a waiting worker looks whether a peer failed


class LocalHub:
    """Shards shared by the worker threads of one job, and the turnstile that orders their requests.

    ``aborted`` tells whether a peer thread failed (its group was aborted): a worker waiting for
    that peer's turn then raises :class:`threading.BrokenBarrierError` instead of waiting it out.
    """

    def __init__(self, shards: list[ShardState], ranges: list[tuple[int, int]], world_size: int,
                 timeout_s: float = 300.0, aborted: Callable[[], bool] = lambda: False) -> None:
        self.shards, self.ranges, self.world_size, self.timeout_s = shards, ranges, world_size, timeout_s
        self.refused = 0
        self.aborted = aborted
        self.on_control: dict[int, Callable[[int, int], None]] = {}  # dedicated servers, by shard
        self._cond = threading.Condition()
        self._turn = 0
        self._done = [False] * world_size

    def wait_for(self, ready: Callable[[], bool], rank: int, what: str) -> None:
        """Wait (holding ``_cond``) until ``ready()``; raise if a peer failed or after ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while not self._cond.wait_for(ready, timeout=ABORT_POLL_S):
            if self.aborted():
                raise threading.BrokenBarrierError(f"worker {rank} stopped waiting for {what}: a peer failed")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {rank} waited more than {self.timeout_s:g} s for {what}")

    def _take_turn(self, rank: int) -> None:
        self.wait_for(lambda: self._turn == rank, rank, "its turn")

    def _pass_turn(self) -> None:
        nxt = (self._turn + 1) % self.world_size
        while self._done[nxt] and not all(self._done):
            nxt = (nxt + 1) % self.world_size
        self._turn = nxt
        self._cond.notify_all()

    def request(self, rank: int, fn):
        """Run ``fn()`` when it is ``rank``'s turn, then hand the turn on."""
        with self._cond:
            self._take_turn(rank)
            try:
                return fn()
            finally:
                self._pass_turn()

    def leave(self, rank: int) -> None:
        """``rank`` makes no more requests: skip it in the round-robin."""
        with self._cond:
            self._done[rank] = True
            if self._turn == rank:
                self._pass_turn()


class LocalClient:
    """One worker's view of a :class:`LocalHub`, with :class:`~irbis.train.ps.transport.PSClient`'s methods."""

    #: Requests take turns in rank order, so every worker takes the same number of steps.
    free_running = False

    def __init__(self, hub: LocalHub, worker: int) -> None:
        self.hub, self.worker, self.ranges = hub, worker, hub.ranges
        self.versions = [0] * len(hub.shards)
        self.seq = 0
        self.rejected = 0

    def hello(self, timeout_s: float = 10.0) -> None:
        """Nothing to reach in one process."""

    def push(self, grads: np.ndarray, lr: float, pull_into: np.ndarray | None = None) -> None:
        self.seq += 1
        statuses = self.hub.request(self.worker, lambda: [
            s.push(self.worker, self.seq, self.versions[i], grads[lo:hi], lr)
            for i, (s, (lo, hi)) in enumerate(zip(self.hub.shards, self.ranges))])
        self.rejected += sum(st == REJECTED for st in statuses)
        if pull_into is not None:
            self.pull(pull_into)

    def pull(self, into: np.ndarray) -> None:
        def read() -> None:
            for i, (s, (lo, hi)) in enumerate(zip(self.hub.shards, self.ranges)):
                self.versions[i], into[lo:hi] = s.pull(self.worker)
        self.hub.request(self.worker, read)

    def stats(self, shard_ids: list[int]) -> np.ndarray:
        with self.hub._cond:
            parts = [self.hub.shards[i].stats() for i in shard_ids]
        return np.sum(parts, axis=0) if parts else np.zeros(0, dtype=np.int64)

    def control(self, command: int, step: int, shard_ids: list[int]) -> None:
        """Run each shard's dedicated-server handler (see :mod:`irbis.train.ps.dedicated`), in turn."""
        for sid in shard_ids:
            self.hub.on_control[sid](command, step)

    def leave(self) -> None:
        """This worker makes no more pushes or pulls (a mixed group's member that is not its leader): the
        others stop waiting for its turn; :meth:`stats` still answers."""
        self.hub.leave(self.worker)

    def close(self) -> None:
        self.leave()


__all__ = ["LocalClient", "LocalHub"]
