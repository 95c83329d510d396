"""A task's share of its executor's cores (irbis.spark.resources.SharedCores), without Spark: the tasks are
registrations of this process and of forked children, as the Python workers of one executor are children of
one process."""
from __future__ import annotations

import multiprocessing
import os

import pytest

from irbis.spark.resources import SharedCores


def test_a_task_alone_takes_every_slot_and_gives_them_back_as_others_start(tmp_path):
    with SharedCores(1, 2, root=tmp_path) as first:
        assert first.threads() == 2
        with SharedCores(1, 2, root=tmp_path) as second:
            assert first.threads() == second.threads() == 1
            assert first.running() == 2
        assert first.running() == 1
        assert first.threads() == 1  # no more cores later: each thread count loads its own engine
        with SharedCores(1, 2, root=tmp_path) as third:
            assert third.threads() == 1
    assert not any((tmp_path / str(os.getppid())).iterdir())  # nothing left behind


def test_three_tasks_on_four_slots_take_one_each_and_a_task_keeps_its_own_cpus(tmp_path):
    with SharedCores(1, 4, root=tmp_path) as a, SharedCores(1, 4, root=tmp_path), SharedCores(1, 4, root=tmp_path):
        assert a.threads() == 1  # 4 // 3
    with SharedCores(2, 2, root=tmp_path) as wide, SharedCores(2, 2, root=tmp_path):
        assert wide.threads() == 2  # never below the task's own spark.task.cpus


@pytest.mark.parametrize("slots", [None, 1])
def test_without_slots_to_share_the_task_keeps_its_cpus_and_registers_nothing(tmp_path, slots):
    with SharedCores(3, slots, root=tmp_path) as share:
        assert share.threads() == 3
    assert not (tmp_path / str(os.getppid())).exists()


def test_a_file_no_task_holds_is_not_counted_and_is_removed(tmp_path):
    """A worker killed mid-task leaves its file unlocked (the lock dies with the process)."""
    folder = tmp_path / str(os.getppid())
    folder.mkdir()
    (folder / "12345-0").write_text("")
    with SharedCores(1, 2, root=tmp_path) as share:
        assert share.threads() == 2
    assert not (folder / "12345-0").exists()


def _hold(root, ready, release):
    with SharedCores(1, 2, root=root):
        ready.set()
        release.wait(60)


def test_a_task_of_another_worker_process_counts(tmp_path):
    """Forked children share their parent as the Python workers of one executor share their daemon."""
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    child = context.Process(target=_hold, args=(tmp_path / "by-parent", ready, release))
    # the child's folder is keyed by its parent (this process): register this process's share there too
    child.start()
    try:
        assert ready.wait(60)
        share = SharedCores(1, 2, root=tmp_path / "by-parent")
        share.folder = tmp_path / "by-parent" / str(os.getpid())
        with share:
            assert share.running() == 2 and share.threads() == 1
            release.set()
            child.join(60)
            assert share.running() == 1
    finally:
        release.set()
        child.join(60)
