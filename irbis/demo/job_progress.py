"""A tqdm progress bar, in images, over the Spark jobs of a block of code.

On a classic session it polls Spark's status tracker for the jobs of a job group of its own; on
Spark Connect it listens to the progress that the server sends with each operation's results
(``SparkSession.registerProgressHandler``).
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession
from tqdm.auto import tqdm

from irbis.spark.session import is_connect

__all__ = ["spark_progress", "timed"]


class _Bar:
    """The bar's position over a block of ``steps`` parts: ``images`` times the share of the parts done,
    the current part counting as the share of the Spark tasks known since it began that finished; never
    moving back, and never past the current part's end before :meth:`step` says it is done."""

    def __init__(self, bar: Any, images: int, steps: int = 1) -> None:
        self.bar, self.images, self.steps = bar, images, max(1, steps)
        self.done = 0
        self._seen = self._start = (0, 0)  # the tasks (finished, known) last seen, and when the part began
        self._lock = threading.Lock()

    def show(self, finished: int, total: int) -> None:
        """The block's Spark tasks so far: ``finished`` of the ``total`` known."""
        with self._lock:
            self._seen = (finished, total)
            known = total - self._start[1]
            share = min((finished - self._start[0]) / known, 1.0) if known > 0 else 0.0
            self._move(min(self.done + share, self.steps))

    def step(self) -> None:
        """One part of the block is done: the next part's share counts the tasks known from now on."""
        with self._lock:
            self.done = min(self.done + 1, self.steps)
            self._start = self._seen
            self._move(self.done)

    def _move(self, parts: float) -> None:
        self.bar.n = max(self.bar.n, min(int(self.images * parts / self.steps), self.images))
        self.bar.refresh()


@contextmanager
def timed(clock: dict[str, float], name: str) -> Iterator[None]:
    """Add the seconds spent in the block to ``clock[name]`` (the demos' phases)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        clock[name] = clock.get(name, 0.0) + time.perf_counter() - t0


@contextmanager
def spark_progress(spark: SparkSession, description: str, images: int, enabled: bool = True,
                   interval: float = 0.5, steps: int = 1, unit: str = "img") -> Iterator[Any]:
    """Show how many of ``images`` the Spark jobs started inside the ``with`` block have processed.

    The bar's total is fixed at ``images``; its position is ``images`` times the share of the known
    tasks that finished, never moving back when a new job adds tasks, and the whole total when the
    block ends. The count is exact when the block runs one job over evenly sized partitions (as the
    demo's featurisation does: its input is cached in equal parts first). A block of several jobs, or
    of work off Spark, declares its ``steps`` parts and calls the bar's ``step()`` as each ends (the
    cross-validation's fits, say): each part then takes its share of the bar, so that the bar shows the
    parts still to run instead of reaching the total between two jobs. ``interval`` is the classic
    session's polling period; ``unit`` names what the bar counts (images by default). The ``with`` block
    gets the tqdm bar, with ``step`` added.
    """
    bar = tqdm(total=images, desc=description, unit=unit, disable=not enabled, leave=True)
    follow = _connect_progress if is_connect(spark) else _classic_progress
    position = _Bar(bar, images, steps)
    bar.step = position.step
    try:
        with follow(spark, description, position, interval):
            yield bar
    finally:
        bar.n = images  # skipped stages (results reused) never report their tasks
        bar.close()


@contextmanager
def _classic_progress(spark: SparkSession, description: str, bar: _Bar, interval: float) -> Iterator[None]:
    sc = spark.sparkContext
    group = f"irbis-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, description)
    done = threading.Event()

    def poll() -> None:
        tracker = sc.statusTracker()
        while True:
            total = finished = 0
            for job in tracker.getJobIdsForGroup(group):
                info = tracker.getJobInfo(job)
                ended = info is not None and info.status == "SUCCEEDED"  # its skipped stages never run
                for stage in (info.stageIds if info else []):
                    s = tracker.getStageInfo(stage)
                    if s is not None:
                        total += s.numTasks
                        finished += s.numTasks if ended else s.numCompletedTasks
            bar.show(finished, total)
            if done.wait(interval):
                return

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]  # None removes it
        sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]


@contextmanager
def _connect_progress(spark: SparkSession, description: str, bar: _Bar, interval: float) -> Iterator[None]:
    seen: dict[tuple[str | None, int], tuple[int, int]] = {}  # (operation, stage) -> (tasks, finished)
    lock = threading.Lock()  # operations run from several threads (a training job's) call the handler at once

    def handler(stages: Any, inflight_tasks: int, operation_id: str | None, done: bool) -> None:
        with lock:
            for stage in stages or ():  # a finished operation's skipped stages (results reused) never run
                seen[(operation_id, stage.stage_id)] = (stage.num_tasks, stage.num_tasks if done else
                                                        stage.num_completed_tasks)
            counts = list(seen.values())
        bar.show(sum(f for _, f in counts), sum(t for t, _ in counts))

    spark.registerProgressHandler(handler)  # type: ignore[arg-type]  # a function is a ProgressHandler
    try:
        yield
    finally:
        spark.removeProgressHandler(handler)  # type: ignore[arg-type]
