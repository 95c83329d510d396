"""The scale simulator's model (benchmarks/scale_sim.py) on cases with a known answer."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from scale_sim import Network, Scenario, Sim, simulate  # noqa: E402


def scenario(**kw):
    base = dict(nodes=1, compute=0.01, batch=32, params=10_000, strategy="sync", nbytes=40_000,
                bandwidth_gbit=10.0, shards=1)
    return Scenario(**{**base, **kw})


@pytest.mark.parametrize("strategy", ["sync", "one_bit", "downpour", "dcasgd", "mixed"])
def test_one_node_runs_at_its_compute_rate(strategy):
    r = simulate(scenario(strategy=strategy), steps=50)
    assert r.samples_per_second == pytest.approx(32 / 0.01)
    assert set(r.staleness) == {0}


@pytest.mark.parametrize("nodes", [2, 8, 64])
def test_sync_with_a_free_network_scales_linearly(nodes):
    free = simulate(scenario(nodes=nodes, bandwidth_gbit=math.inf, latency=0.0), steps=20)
    slow = simulate(scenario(nodes=nodes, bandwidth_gbit=1.0, nbytes=4e6), steps=20)
    assert free.samples_per_second == pytest.approx(nodes * 32 / 0.01)
    assert slow.samples_per_second < 0.9 * free.samples_per_second


def test_parameter_server_staleness_grows_with_workers_and_dedicated_nodes_count():
    r = simulate(scenario(nodes=8, strategy="downpour", shards=4, dedicated=True), steps=30)
    assert r.nodes_used == 12 and max(r.staleness) >= 4 and min(r.staleness) >= 0
    assert len(r.staleness) >= 8 * 30 * 4


def test_a_straggler_holds_back_sync_but_not_downpour():
    kw = dict(nodes=4, bandwidth_gbit=100.0, slow={0: 3.0})
    sync = simulate(scenario(**kw), steps=60).samples_per_second
    down = simulate(scenario(strategy="downpour", shards=4, **kw), steps=60).samples_per_second
    assert sync == pytest.approx(4 * 32 / 0.03, rel=0.05) and down > 1.8 * sync


def test_links_are_first_come_first_served_and_a_node_to_itself_is_free():
    net = Network(bandwidth=1000.0, latency=0.5)
    assert net.transfer(0.0, 0, 1, 1000) == 1.5
    assert net.transfer(0.0, 0, 2, 1000) == 2.5  # waits for node 0's uplink
    assert net.transfer(0.0, 3, 3, 1000) == 0.0


def test_event_loop_resumes_in_time_order():
    sim, seen = Sim(), []

    def proc(name, times):
        for t in times:
            yield t
            seen.append((sim.now, name))

    sim.spawn(proc("a", [3.0, 5.0]))
    sim.spawn(proc("b", [1.0, 4.0]))
    sim.run(math.inf)
    assert seen == [(1.0, "b"), (3.0, "a"), (4.0, "b"), (5.0, "a")]


def test_group_size_must_divide_the_workers():
    with pytest.raises(ValueError, match="group size 3 does not divide 8"):
        simulate(scenario(nodes=8, strategy="mixed", group=3))
