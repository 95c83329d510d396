"""The simulated hosts (:mod:`irbis.spark.hosts`): their links carry no more than their bandwidth, a cut link
passes nothing until mended, a dead host's processes are gone, and nothing the harness made outlives it.

They need root and network namespaces: where this machine cannot make them, every test here is skipped
with the reason :func:`irbis.spark.hosts.unavailable` gives. No Spark here: the standalone cluster across
the hosts is ``tests/cluster/test_standalone.py``'s.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from irbis.spark import hosts as simulated
from irbis.spark.hosts import SimulatedHosts

WHY = simulated.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

#: A receiver on host 0 that prints the bytes it got and their rate in Mbit/s, from its first byte to the end.
RECEIVER = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 9000)); s.listen(); print("ready", flush=True)
c, _ = s.accept(); n, t = 0, None
while True:
    b = c.recv(1 << 16)
    t = t or time.perf_counter()
    if not b:
        break
    n += len(b)
print(n, n * 8 / (time.perf_counter() - t) / 1e6, flush=True)
"""
SENDER = ("import socket, sys; c = socket.create_connection((sys.argv[1], 9000), timeout=20); "
          "c.sendall(b'x' * int(sys.argv[2]))")
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"


def _names() -> str:
    return (subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            + subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout)


def test_a_link_carries_no_more_than_its_bandwidth():
    """4 MB from host 1 to host 0 over 16 Mbit/s links: all of it arrives, no faster than the link allows
    (a busy machine can only make it slower). Without the shaping the same bytes pass at Gbit/s."""
    with SimulatedHosts(2, rate="16mbit") as hosts:
        receiver = hosts.popen(0, [sys.executable, "-c", RECEIVER, hosts.address(0)], stdout=subprocess.PIPE,
                               text=True)
        assert receiver.stdout.readline().strip() == "ready"
        hosts.run(1, [sys.executable, "-c", SENDER, hosts.address(0), str(4_000_000)], check=True, timeout=60)
        received, mbits = receiver.communicate(timeout=60)[0].split()
        assert int(received) == 4_000_000
        assert float(mbits) <= 16 * 1.15, mbits  # the token bucket's burst aside


def test_a_cut_link_passes_nothing_until_mended_and_a_dead_host_runs_nothing():
    with SimulatedHosts(2) as hosts:
        server = hosts.popen(0, [sys.executable, "-m", "http.server", "--bind", hosts.address(0), "9001"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reach = [sys.executable, "-c", CONNECT, hosts.address(0), "9001", "20"]
        for _ in range(50):  # until the server listens
            if hosts.run(1, reach, capture_output=True).returncode == 0:
                break
        else:
            pytest.fail("the server on host 0 never answered host 1")
        hosts.cut(0)
        cut = hosts.run(1, [sys.executable, "-c", CONNECT, hosts.address(0), "9001", "1"], capture_output=True,
                        text=True)
        assert cut.returncode != 0 and ("timed out" in cut.stderr or "unreachable" in cut.stderr), cut.stderr
        hosts.mend(0)
        assert hosts.run(1, reach, capture_output=True).returncode == 0
        hosts.kill(0)
        assert server.wait(10) != 0  # killed with its host
        assert subprocess.run(["ip", "netns", "pids", hosts.namespace(0)], capture_output=True,
                              text=True).stdout.split() == []


def test_nothing_made_outlives_the_harness_even_when_its_block_fails():
    with pytest.raises(RuntimeError, match="the body failed"):
        with SimulatedHosts(2) as hosts:
            hosts.popen(1, ["sleep", "300"])
            tag = hosts.tag
            assert tag in _names()
            raise RuntimeError("the body failed")
    assert tag not in _names()


def test_what_a_dead_process_left_is_removed_by_the_next_harness():
    """Namespaces and links named after a process that no longer runs are removed; a live one's are kept."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale, live = f"{simulated.PREFIX}{dead}h0", f"{simulated.PREFIX}{os.getpid()}h9"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = simulated.remove_stale()
        assert stale in removed and live not in removed
        assert stale not in _names() and live in _names()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_delay_without_netem_is_refused_naming_what_is_missing():
    if simulated.has_netem():
        pytest.skip("this kernel has netem: delays are made, not refused")
    with pytest.raises(simulated.HostsUnavailable, match="netem"):
        SimulatedHosts(1, delay="5ms").open()
    assert simulated.PREFIX + str(os.getpid()) + "br" not in _names()
