"""The one device rule (irbis.kernels.device): the GPU Spark assigned the task, else one per task, else the
CPU; checked without a GPU, since the rule is a function of the request, the assignment and the GPU count."""

from __future__ import annotations

import pytest

from irbis.kernels.device import Assignment, assign_task, assigned, task_device


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_each_task_runs_on_the_gpu_spark_assigned_it(device):
    assert [task_device(device, Assignment((str(a),), partition=p), visible=4)
            for p, a in enumerate([2, 0, 3, 1])] == ["cuda:2", "cuda:0", "cuda:3", "cuda:1"]


def test_tasks_sharing_a_gpu_get_the_address_they_share():
    shared = [task_device("auto", Assignment(("1",), partition=p), visible=2) for p in range(4)]
    assert shared == ["cuda:1"] * 4


def test_without_an_assignment_tasks_spread_over_the_visible_gpus():
    assert [task_device("auto", Assignment((), partition=p), visible=3) for p in range(6)] == \
        ["cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:1", "cuda:2"]
    assert task_device("auto", Assignment(), visible=1) == "cuda:0"


def test_no_gpu_means_the_cpu_for_auto_and_an_error_for_cuda():
    assert task_device("auto", Assignment((), partition=3), visible=0) == "cpu"
    with pytest.raises(ValueError, match="no CUDA device is visible"):
        task_device("cuda", Assignment(), visible=0)


def test_cpu_is_the_cpu_whatever_spark_assigned():
    assert task_device("cpu", Assignment(("3",), partition=1), visible=4) == "cpu"


def test_a_task_given_no_gpu_by_an_executor_that_schedules_them_names_the_setting():
    with pytest.raises(ValueError, match="spark.task.resource.gpu.amount"):
        task_device("auto", Assignment((), partition=0, required=True), visible=4)


def test_an_assigned_address_the_worker_cannot_see_is_an_error():
    with pytest.raises(ValueError, match="assigned this task GPU '5'.*sees 2"):
        task_device("auto", Assignment(("5",)), visible=2)


def test_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match="device must be one of"):
        task_device("gpu", Assignment(), visible=1)


def test_the_running_tasks_assignment_is_what_task_device_reads(monkeypatch):
    import irbis.kernels.device as rule

    monkeypatch.setattr(rule, "visible_gpus", lambda: 4)
    before = assigned()
    try:
        assign_task(Assignment(("3",), partition=0))
        assert task_device("auto") == "cuda:3"
        assign_task(Assignment((), partition=6))
        assert task_device("auto") == "cuda:2"
        assert task_device("cuda:1") == "cuda:1"  # a resolved name stays as it is
    finally:
        assign_task(before)
    assert task_device("cpu") == "cpu"
