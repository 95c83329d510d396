"""A task's share of its executor's cores (irbis.spark.resources.SharedCores), without Spark: the tasks are
registrations of this process (each under a task id of its own) and of forked children, as the Python workers
of one executor are children of one process."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from irbis.spark.resources import SharedCores


def share(root, task: int, slots: int | None = 2, cpus: int = 1, grace_s: float = 0.0) -> SharedCores:
    return SharedCores(cpus, slots, root=root, task=task, grace_s=grace_s)


def test_a_task_alone_takes_every_slot_and_gives_them_back_as_others_start(tmp_path):
    with share(tmp_path, 1) as first:
        assert first.threads() == 2
        with share(tmp_path, 2) as second:
            assert first.threads() == second.threads() == 1
            assert first.running() == 2
        assert first.running() == 1
        assert first.threads() == 1  # no more cores later: each thread count loads its own engine
        with share(tmp_path, 3) as third:
            assert third.threads() == 1
    assert not any((tmp_path / str(os.getppid())).iterdir())  # nothing left behind


def test_three_tasks_on_four_slots_take_one_each_and_a_task_keeps_its_own_cpus(tmp_path):
    with share(tmp_path, 1, 4) as a, share(tmp_path, 2, 4), share(tmp_path, 3, 4):
        assert a.threads() == 1  # 4 // 3
    with share(tmp_path, 1, 2, cpus=2) as wide, share(tmp_path, 2, 2, cpus=2):
        assert wide.threads() == 2  # never below the task's own spark.task.cpus


def test_a_task_running_two_kernels_counts_once(tmp_path):
    """Two stages' UDFs in one Spark task register twice under one task id."""
    with share(tmp_path, 7) as a, share(tmp_path, 7) as b:
        assert a.running() == b.running() == 1
        assert a.threads() == b.threads() == 2


def test_a_task_alone_at_its_first_batch_waits_for_the_others_of_its_stage(tmp_path):
    """The second task registers 0.1 s after the first asked: within the grace, so both take one core."""
    second = share(tmp_path, 2)
    late = threading.Timer(0.1, second.__enter__)
    with share(tmp_path, 1, grace_s=30.0) as first:
        late.start()
        started = time.monotonic()
        assert first.threads() == 1
        assert time.monotonic() - started < 30.0  # it stopped waiting when the other came
        late.join()
        second.__exit__(None, None, None)
    with share(tmp_path, 3, grace_s=0.2) as alone:  # nobody comes: every core after the grace
        started = time.monotonic()
        assert alone.threads() == 2 and time.monotonic() - started >= 0.2


@pytest.mark.parametrize("slots", [None, 1])
def test_without_slots_to_share_the_task_keeps_its_cpus_and_registers_nothing(tmp_path, slots):
    with share(tmp_path, 1, slots, cpus=3) as alone:
        assert alone.threads() == 3
    assert not (tmp_path / str(os.getppid())).exists()


def test_a_file_no_task_holds_is_not_counted_and_is_removed(tmp_path):
    """A worker killed mid-task leaves its file unlocked (the lock dies with the process)."""
    folder = tmp_path / str(os.getppid())
    folder.mkdir()
    (folder / "99-12345-0").write_text("")
    with share(tmp_path, 1) as alone:
        assert alone.threads() == 2
    assert not (folder / "99-12345-0").exists()


def _hold(root, ready, release):
    with SharedCores(1, 2, root=root, task=2):
        ready.set()
        release.wait(60)


def test_a_task_of_another_worker_process_counts(tmp_path):
    """Forked children share their parent as the Python workers of one executor share their daemon."""
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    child = context.Process(target=_hold, args=(tmp_path, ready, release))
    child.start()
    try:
        assert ready.wait(60)
        mine = share(tmp_path, 1)
        mine.folder = tmp_path / str(os.getpid())  # the child's folder is keyed by its parent, this process
        with mine:
            assert mine.running() == 2 and mine.threads() == 1
            release.set()
            child.join(60)
            assert mine.running() == 1
    finally:
        release.set()
        child.join(60)
