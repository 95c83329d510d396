"""The training benchmarks' own logic: which rate each strategy gets, and what the end-to-end table says."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from async_e2e import contenders, report  # noqa: E402
from peers import PeerNotRun, not_run  # noqa: E402
from train_async import ADAGRAD_LR, ASYNC, DCASGD_SGD, LR, SCHEDULE, learning_rate  # noqa: E402


def row(mode, e2e, acc, wall=20.0):
    return {"mode": mode, "lr": 0.01, "e2e": e2e, "loop": float("nan"), "acc": acc, "wall": wall}


def test_a_rate_follows_the_server_rule_the_strategy_runs():
    assert learning_rate("sync", {}, 8) == LR
    assert learning_rate("downpour", {}, 2) == pytest.approx(2 * ADAGRAD_LR / 2)
    # downpour on an SGD server gets dcasgd's rate: the two then differ only in the delay compensation
    assert learning_rate("downpour", {"serverOptimizer": "sgd"}, 8) == learning_rate("dcasgd", DCASGD_SGD, 8) == LR / 8
    assert learning_rate("dcasgd", {}, 2) == pytest.approx(2 * ADAGRAD_LR / 2)  # its default rule is Adagrad
    assert learning_rate("mixed", {"groupSize": 2}, 4) == pytest.approx(2 * ADAGRAD_LR * 2 / 4)


def test_each_side_sweeps_its_own_grid_around_its_own_rate():
    sides = contenders(ASYNC, lambda name, sopts: learning_rate(name, sopts, 2), SCHEDULE, quick=False)
    assert set(sides) == {"irbis downpour", "irbis mixed {'groupSize': 2}", "irbis dcasgd {'serverOptimizer': 'sgd'}",
                          "sparktorch hogwild"}
    assert learning_rate("dcasgd", DCASGD_SGD, 2) in sides["irbis dcasgd {'serverOptimizer': 'sgd'}"][0]
    assert (sides["irbis downpour"][0] != sides["irbis dcasgd {'serverOptimizer': 'sgd'}"][0]
            != sides["sparktorch hogwild"][0])
    assert all(len(grid) >= 3 for grid, _ in sides.values())


def test_the_table_says_when_the_baseline_did_not_learn():
    text = "\n".join(report(30, [], [row("irbis dcasgd", 3000.0, 0.96), row("sparktorch hogwild", 1000.0, 0.18)]))
    assert "did NOT learn" in text
    assert "3.0x" in text
    learned = "\n".join(report(30, [], [row("irbis dcasgd", 3000.0, 0.96), row("sparktorch hogwild", 1000.0, 0.93)]))
    assert "did NOT learn" not in learned and "sparktorch hogwild learned" in learned


def test_a_missing_baseline_leaves_no_ratio_and_is_named():
    text = "\n".join(report(30, [not_run("sparktorch hogwild", PeerNotRun("sparktorch is not installed"))],
                            [row("irbis dcasgd", 3000.0, 0.96)]))
    assert "sparktorch hogwild: not run: PeerNotRun: sparktorch is not installed" in text
    assert "no baseline in this table" in text
    assert next(line for line in text.splitlines() if line.startswith("irbis dcasgd")).endswith(" -")


def test_a_grid_grows_past_the_edge_its_best_rate_sits_on():
    from async_e2e import best_rate, widened

    assert widened({0.1: 0.90, 0.2: 0.95, 0.4: 0.93}) is None
    assert widened({0.1: 0.90, 0.2: 0.93, 0.4: 0.95}) == pytest.approx(0.8)  # the top: one step further up
    assert widened({0.001: 0.95, 0.003: 0.93, 0.01: 0.90}) == pytest.approx(0.001 / 3)  # the bottom: down
    # a top rate whose loss diverged is not a reason to go higher; the best finite rate is chosen
    assert widened({0.1: 0.80, 0.2: 0.90, 0.4: float("nan")}) is None
    assert widened({0.1: 0.90, 0.2: float("nan")}) == pytest.approx(0.05)
    assert best_rate({0.1: 0.90, 0.2: float("nan")}) == 0.1
    assert best_rate({0.1: float("nan"), 0.2: float("nan")}) == 0.1
