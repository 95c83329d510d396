"""A tqdm progress bar over the Spark tasks of a block of code (polls Spark's status tracker)."""
from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession
from tqdm.auto import tqdm

__all__ = ["spark_progress"]


@contextmanager
def spark_progress(spark: SparkSession, description: str, enabled: bool = True,
                   interval: float = 0.5) -> Iterator[None]:
    """Show the completed / known tasks of the Spark jobs started inside the ``with`` block.

    The jobs run under a job group of their own; the bar's total grows as new jobs appear.
    """
    sc = spark.sparkContext
    group = f"irbis-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, description)
    bar = tqdm(total=0, desc=description, unit="task", disable=not enabled, leave=True)
    done = threading.Event()

    def poll() -> None:
        tracker = sc.statusTracker()
        while True:
            total = finished = 0
            for job in tracker.getJobIdsForGroup(group):
                info = tracker.getJobInfo(job)
                for stage in (info.stageIds if info else []):
                    s = tracker.getStageInfo(stage)
                    if s is not None:
                        total, finished = total + s.numTasks, finished + s.numCompletedTasks
            if total:
                bar.total = max(total, bar.total or 0)
                bar.n = min(finished, bar.total)
                bar.refresh()
            if done.wait(interval):
                return

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if bar.total:
            bar.n = bar.total  # skipped stages (results reused) never report their tasks
        bar.close()
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
