"""The demo's progress bars show the work that remains: a block of several parts (the cross-validation's
fits, the refit, the scoring) does not reach its total when one Spark job ends and another is to come."""
import io

import numpy as np
from tqdm import tqdm

from irbis.demo.camera_trap import _cv_fits
from irbis.demo.head import HEAD_GRID, cross_validate_head
from irbis.demo.job_progress import _Bar
from irbis.demo.ladder import REG_GRID


def bar(images, steps=1):
    return _Bar(tqdm(total=images, file=io.StringIO()), images, steps)


def test_a_single_job_block_fills_the_bar_as_its_tasks_finish():
    one = bar(100)
    one.show(1, 4)
    assert one.bar.n == 25
    one.show(4, 4)
    assert one.bar.n == 100


def test_a_block_of_parts_stays_short_of_its_total_until_its_last_part_runs():
    block = bar(90, steps=3)
    block.show(2, 2)  # the first part's job ended: a third of the block, not all of it
    assert block.bar.n == 30
    block.show(2, 2)
    block.step()
    assert block.bar.n == 30
    block.show(3, 6)  # the second part's job: 1 of its 4 tasks
    assert block.bar.n == 30 + 7
    block.show(6, 6)
    assert block.bar.n == 60
    block.step()
    block.show(6, 6)  # work off Spark (no tasks yet): the bar holds, short of the total
    assert block.bar.n == 60
    block.show(5, 6)  # it never moves back
    assert block.bar.n == 60
    block.step()
    assert block.bar.n == 90


def test_the_head_cross_validation_reports_each_fit_it_ran():
    rng = np.random.default_rng(0)
    y = np.arange(60) % 2
    x = rng.normal(size=(60, 3)) + y[:, None]
    fits = []
    cross_validate_head(x, y, np.arange(60) % 3, grid={"hidden": (4,), "weight_decay": (1e-4, 1e-2)},
                        epochs=(2,), on_fit=lambda: fits.append(1))
    assert len(fits) == _cv_fits(3, {"hidden": (4,), "weight_decay": (1e-4, 1e-2)}) == 6
    assert _cv_fits(3) == 3 * len(REG_GRID) and _cv_fits(2, HEAD_GRID) == 2 * 2 * 2


def test_the_connect_handler_takes_reports_from_several_threads_at_once():
    import threading
    from types import SimpleNamespace

    from irbis.demo.job_progress import _connect_progress

    handlers = []
    session = SimpleNamespace(registerProgressHandler=handlers.append, removeProgressHandler=handlers.remove)
    block, errors = bar(1000), []

    def report(op):
        try:
            for s in range(300):  # each report adds a stage while the other threads sum the stages seen
                handlers[0]([SimpleNamespace(stage_id=s, num_tasks=2, num_completed_tasks=1)], 0, op, False)
        except Exception as err:  # noqa: BLE001 - any error fails the test below
            errors.append(err)

    with _connect_progress(session, "scoring", block, 0.1):
        threads = [threading.Thread(target=report, args=(f"op{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and handlers == []
    assert block.bar.n == 500  # 2400 stages of 2 tasks, half of them finished
