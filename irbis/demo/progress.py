"""A tqdm progress bar, in images, over the Spark jobs of a block of code (polls Spark's status tracker)."""
from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession
from tqdm.auto import tqdm

__all__ = ["spark_progress"]


@contextmanager
def spark_progress(spark: SparkSession, description: str, images: int, enabled: bool = True,
                   interval: float = 0.5) -> Iterator[None]:
    """Show how many of ``images`` the Spark jobs started inside the ``with`` block have processed.

    The jobs run under a job group of their own. The bar's total is fixed at ``images``; its position
    is ``images`` times the share of the known tasks that finished, never moving back when a new job
    adds tasks, and the whole total when the block ends. The count is exact when the block runs one
    job over evenly sized partitions (as the demo's featurisation does: its input is cached in equal
    parts first); a block of several jobs may reach the total between two of them.
    """
    sc = spark.sparkContext
    group = f"irbis-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, description)
    bar = tqdm(total=images, desc=description, unit="img", disable=not enabled, leave=True)
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
                bar.n = max(bar.n, min(images * finished // total, images))
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
        bar.n = images  # skipped stages (results reused) never report their tasks
        bar.close()
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
