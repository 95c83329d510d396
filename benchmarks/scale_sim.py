"""A discrete-event model of data-parallel training on a cluster (plain Python, ``heapq``).

Used by ``simulate_scale.py``; it is a benchmark aid, not part of the library.

What is modelled
----------------
* Each node has one compute device (a step takes ``compute`` seconds, times its
  straggler factor) and a full-duplex NIC: a transfer of ``b`` bytes from ``a`` to
  ``c`` takes ``b / bandwidth`` seconds on ``a``'s uplink and on ``c``'s downlink,
  each a first-come-first-served queue (cut-through: the downlink takes the bytes
  as the uplink sends them), and arrives ``latency`` later. A node talking to itself
  (a co-located shard) costs nothing on the network.
* Collective strategies (``sync``, ``model_averaging``, ``one_bit``) exchange their
  bytes per step with a ring (all-reduce: ``2 (N-1)/N · B``; all-gather: ``(N-1) · B``
  per node), after the slowest worker's compute: synchronous steps wait for stragglers.
* Parameter-server strategies (``downpour``, ``dcasgd``, ``mixed``) pull the K shards'
  weights every ``fetch_every`` steps, compute, and push gradients to every shard; a
  shard applies updates one at a time on its own CPU (``apply_per_param`` seconds per
  parameter) and counts versions. An update's staleness is the number of versions
  the shard advanced between the worker's pull and the update's apply. ``mixed``
  runs a ring all-reduce inside each group of ``group`` workers, whose leader talks
  to the shards. Shards sit on the first K worker nodes (co-located) or on K extra
  nodes (dedicated).

What is not: compute/communication overlap inside a step, contention between a
co-located shard and the worker for the CPU or PCIe, TCP dynamics and
serialization costs beyond ``apply_per_param``.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field

Process = Generator[float | None, None, None]


class Sim:
    """The event loop: a process (generator) yields the time at which to resume it, or None
    to sleep until another process hands it back to :meth:`spawn`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Process]] = []
        self._seq = 0

    def spawn(self, proc: Process, at: float | None = None) -> None:
        heapq.heappush(self._queue, (self.now if at is None else at, self._seq, proc))
        self._seq += 1

    def run(self, until: float) -> None:
        while self._queue and self._queue[0][0] <= until:
            t, _, proc = heapq.heappop(self._queue)
            self.now = t
            try:
                resume = next(proc)
            except StopIteration:
                continue
            if resume is not None:
                self.spawn(proc, max(resume, t))


@dataclass
class Network:
    """Full-duplex NICs with first-come-first-served up- and downlinks."""

    bandwidth: float  # bytes per second per direction (math.inf: free)
    latency: float  # seconds per message
    up: dict[int, float] = field(default_factory=dict)
    down: dict[int, float] = field(default_factory=dict)

    def transfer(self, now: float, src: int, dst: int, nbytes: float) -> float:
        """Reserve the links for one message sent at ``now``; return its arrival time."""
        if src == dst or nbytes <= 0:
            return now
        wire = nbytes / self.bandwidth
        start = max(now, self.up.get(src, 0.0))
        self.up[src] = start + wire
        # cut-through: the receiver's downlink takes the bytes as they come, after its earlier messages
        self.down[dst] = max(start + wire, max(start, self.down.get(dst, 0.0)) + wire)
        return self.down[dst] + self.latency

    def ring(self, nodes: int, nbytes: float, gather: bool = False) -> float:
        """Seconds for a ring all-reduce (or all-gather of ``nbytes`` per node) over ``nodes``."""
        if nodes <= 1:
            return 0.0
        hops = nodes - 1 if gather else 2 * (nodes - 1)
        per_hop = nbytes if gather else nbytes / nodes
        return hops * (per_hop / self.bandwidth + self.latency)


@dataclass
class Scenario:
    """One cluster and one strategy; ``nbytes`` is the strategy's payload per step and worker."""

    nodes: int
    compute: float  # seconds per step on one worker
    batch: int  # samples per step per worker
    params: int
    strategy: str
    nbytes: float
    bandwidth_gbit: float = 10.0
    latency: float = 50e-6
    shards: int = 1
    dedicated: bool = False
    fetch_every: int = 1
    group: int = 1
    apply_per_param: float = 0.0
    slow: dict[int, float] = field(default_factory=dict)  # worker -> compute factor
    jitter: float = 0.0  # relative std of compute time (lognormal)
    seed: int = 0


@dataclass
class Result:
    samples_per_second: float
    staleness: list[int]
    nodes_used: int


COLLECTIVE = {"sync": False, "model_averaging": False, "block_momentum": False, "one_bit": True}
PARAMETER_SERVER = ("downpour", "dcasgd", "mixed")


def simulate(sc: Scenario, steps: int = 200) -> Result:
    """Time the cluster's first ``steps`` steps per worker (in total: a fast worker may take more
    than a straggler) and measure throughput and staleness."""
    net = Network(sc.bandwidth_gbit * 1e9 / 8 if math.isfinite(sc.bandwidth_gbit) else math.inf, sc.latency)
    rng = random.Random(sc.seed)

    def compute(w: int) -> float:
        f = sc.slow.get(w, 1.0)
        return sc.compute * f * (rng.lognormvariate(0.0, sc.jitter) if sc.jitter else 1.0)

    if sc.strategy in COLLECTIVE:
        return _collective(sc, net, compute, steps)
    if sc.strategy in PARAMETER_SERVER:
        return _parameter_server(sc, net, compute, steps)
    raise ValueError(f"unknown strategy {sc.strategy!r}; known: {sorted(COLLECTIVE) + list(PARAMETER_SERVER)}")


def _collective(sc: Scenario, net: Network, compute, steps: int) -> Result:
    t = 0.0
    for _ in range(steps):
        t += max(compute(w) for w in range(sc.nodes))
        t += net.ring(sc.nodes, sc.nbytes, gather=COLLECTIVE[sc.strategy])
    return Result(sc.nodes * sc.batch * steps / t, [0] * steps, sc.nodes)


def _parameter_server(sc: Scenario, net: Network, compute, steps: int) -> Result:
    group = sc.group if sc.strategy == "mixed" else 1
    if sc.nodes % group:
        raise ValueError(f"group size {group} does not divide {sc.nodes} nodes")
    k = max(1, min(sc.shards, sc.params))
    home = [sc.nodes + s if sc.dedicated else s % sc.nodes for s in range(k)]
    shard_bytes = 4.0 * sc.params / k
    version, cpu_free = [0] * k, [0.0] * k
    staleness: list[int] = []
    done = [0]
    sim = Sim()

    def apply(s: int, pulled: int, arrival: float, acks: list[Process]) -> Process:
        yield arrival
        cpu_free[s] = max(sim.now, cpu_free[s]) + sc.apply_per_param * sc.params / k
        yield cpu_free[s]
        staleness.append(version[s] - pulled)
        version[s] += 1
        acks.pop()
        if len(acks) == 1:  # every shard has applied: wake the worker
            sim.spawn(acks.pop())

    target = steps * (sc.nodes // group)  # the cluster's steps; fast workers take more than slow ones
    finished = [math.inf]

    def worker(g: int, me: list[Process]) -> Process:
        leader, pulled, step = g * group, [0] * k, 0
        while done[0] < target:
            if step % sc.fetch_every == 0:
                pulled = list(version)
                yield max(net.transfer(sim.now, home[s], leader, shard_bytes) for s in range(k))
                yield sim.now + net.ring(group, 4.0 * sc.params, gather=True) / max(group - 1, 1)
            yield sim.now + max(compute(w) for w in range(leader, leader + group))
            yield sim.now + net.ring(group, 4.0 * sc.params)
            acks: list[Process] = me + [me[0]] * k  # one entry per pending ack, the worker last
            for s in range(k):
                sim.spawn(apply(s, pulled[s], net.transfer(sim.now, leader, home[s], shard_bytes), acks))
            yield None
            done[0] += 1
            step += 1
            if done[0] == target:
                finished[0] = sim.now

    for g in range(sc.nodes // group):
        me: list[Process] = []
        me.append(worker(g, me))
        sim.spawn(me[0])
    sim.run(math.inf)
    return Result(target * group * sc.batch / finished[0], staleness, sc.nodes + (k if sc.dedicated else 0))


def percentiles(values: Iterable[int], qs: tuple[float, ...] = (0.5, 0.95)) -> list[float]:
    """Nearest-rank percentiles (0 for an empty list)."""
    v = sorted(values)
    return [float(v[min(len(v) - 1, int(q * len(v)))]) if v else 0.0 for q in qs]
