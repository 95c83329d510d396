"""Simulated hosts on one machine: network namespaces with their own addresses, joined by shaped links.

Each host is a Linux network namespace with one interface (``eth0``) on a bridge that the machine's own
namespace also sits on, as the driver's host. The links are shaped with ``tc`` (a token bucket per
direction: the bandwidth of a real link), can be cut and mended, and a host can die (every process in its
namespace killed, its link down). A Spark standalone cluster runs across them with
:func:`irbis.spark.standalone.start_standalone` (``hosts=``): the master on the driver's host, a worker on
each simulated host, so that executors reach the driver and each other only over the links.

It needs root and a kernel with network namespaces, veth, bridges and the ``tbf`` queue discipline;
:func:`unavailable` says why not where they are missing. Delay and loss (``netem``) are used where the
kernel has them. Everything made is removed by :meth:`SimulatedHosts.close` (a ``with`` block closes it even
when its body fails), and namespaces left by a process that died are removed by the next one.

Examples
--------
>>> from irbis.spark.hosts import SimulatedHosts   # doctest: +SKIP
>>> with SimulatedHosts(2, rate="100mbit") as hosts:   # doctest: +SKIP
...     server = hosts.popen(0, ["python", "-m", "http.server", "--bind", hosts.address(0)])
...     hosts.cut(0)   # the link down: nothing reaches host 0 until hosts.mend(0)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

#: Names of what a harness makes begin with this and the making process's id (which tells a stale one).
PREFIX = "irbh"


class HostsUnavailable(RuntimeError):
    """This machine cannot make simulated hosts (not root, or the kernel lacks what they need)."""


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check)


def _tc(namespace: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", "netns", "exec", namespace, "tc", *args] if namespace else ["tc", *args], check)


def _probe(name: str, *qdisc: str) -> None:
    """Make a namespace ``name`` holding a veth pair, put the queue discipline ``qdisc`` on one end, and
    remove it all; raises where a step fails."""
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "b0")
        _tc(name, "qdisc", "add", "dev", "a0", "root", *qdisc)
    finally:
        _ip("netns", "del", name, check=False)


def unavailable() -> str | None:
    """Why simulated hosts cannot be made here (None where they can): tried by making a namespace, a veth
    pair and a token bucket, and removing them."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces and tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "simulated hosts need iproute2 (the ip and tc commands)"
    try:
        _probe(f"{PREFIX}{os.getpid()}p", "tbf", "rate", "1gbit", "burst", "64kb", "latency", "100ms")
    except (RuntimeError, OSError) as err:
        return f"simulated hosts cannot be made on this machine: {err}"
    return None


def has_netem() -> bool:
    """Whether the kernel has the ``netem`` queue discipline (delay and loss on a link)."""
    try:
        _probe(f"{PREFIX}{os.getpid()}n", "netem", "delay", "1ms")
    except (RuntimeError, OSError):
        return False
    return True


def remove_stale() -> list[str]:
    """Remove the namespaces, bridges and links that harnesses of processes no longer running left behind;
    return their names."""
    removed = []
    namespaces = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]
    links = re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link").stdout, re.M)
    for name in namespaces + links:
        found = re.fullmatch(rf"{PREFIX}(\d+)\D.*", name)
        if found is None or _alive(int(found.group(1))):
            continue
        if name in namespaces:
            _kill_namespace(name)
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(namespace: str) -> None:
    for pid in _ip("netns", "pids", namespace, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


class SimulatedHosts:
    """``count`` hosts, each a network namespace at :meth:`address` ``(i)``, on a bridge whose address
    (:attr:`driver_address`) is this machine's own namespace: the driver's host.

    Parameters
    ----------
    count : int
        How many hosts.
    rate : str
        Each link's bandwidth in each direction, as ``tc`` reads it (``"1gbit"``, ``"100mbit"``).
    delay, loss : str
        Each link's added delay (``"5ms"``) and packet loss (``"5%"``), empty for none; they need the
        kernel's ``netem`` (:func:`has_netem`), and a clear error says so where it is missing.
    subnet : int
        The second byte of the hosts' network: the hosts are ``10.<subnet>.0.2``, ``.3``, ...; the driver ``.1``.
    """

    def __init__(self, count: int, rate: str = "1gbit", delay: str = "", loss: str = "", subnet: int = 213) -> None:
        if count < 1:
            raise ValueError(f"SimulatedHosts needs at least one host, found count={count}")
        self.count, self.rate, self.delay, self.loss = count, rate, delay, loss
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{self.tag}br"
        self.network = f"10.{subnet}.0"
        self.procs: list[subprocess.Popen[Any]] = []
        self._made: list[str] = []  # namespaces made, in order
        self._open = False

    # -- names ------------------------------------------------------------------------------------
    def namespace(self, i: int) -> str:
        """The network namespace of host ``i``."""
        return f"{self.tag}h{i}"

    def address(self, i: int) -> str:
        """Host ``i``'s address."""
        return f"{self.network}.{i + 2}"

    @property
    def driver_address(self) -> str:
        """The address of this machine's own namespace on the hosts' network (the driver's host)."""
        return f"{self.network}.1"

    def _port(self, i: int) -> str:  # the bridge's side of host i's link
        return f"{self.tag}v{i}"

    # -- life -------------------------------------------------------------------------------------
    def open(self) -> SimulatedHosts:
        """Make the bridge, the namespaces and their links; on any failure, remove what was made."""
        why = unavailable()
        if why:
            raise HostsUnavailable(why)
        if (self.delay or self.loss) and not has_netem():
            raise HostsUnavailable("a link delay or loss needs the kernel's netem queue discipline, which this "
                                   "kernel lacks; shape bandwidth alone (rate=) here")
        remove_stale()
        self._open = True
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.driver_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.count):
                ns, port = self.namespace(i), self._port(i)
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", port, "master", self.bridge)
                _ip("link", "set", port, "up")
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.shape(i, self.rate, self.delay, self.loss)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill every process on the hosts and remove the namespaces, links and bridge."""
        if not self._open:
            return
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for i, ns in enumerate(self._made):
            _kill_namespace(ns)
            _ip("link", "del", self._port(i), check=False)  # both ends: a namespace's own go only when it is freed
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._made, self._open = [], False

    def __enter__(self) -> SimulatedHosts:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the links --------------------------------------------------------------------------------
    def shape(self, i: int, rate: str, delay: str = "", loss: str = "") -> None:
        """Set host ``i``'s link: ``rate`` each way, and ``delay``/``loss`` (netem) where given."""
        for ns, dev in ((self.namespace(i), "eth0"), (None, self._port(i))):  # out of the host, into it
            _tc(ns, "qdisc", "del", "dev", dev, "root", check=False)
            if delay or loss:
                _tc(ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                    *(["delay", delay] if delay else []), *(["loss", loss] if loss else []))
                _tc(ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "tbf", "rate", rate,
                    "burst", "64kb", "latency", "200ms")
            else:
                _tc(ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "64kb", "latency", "200ms")

    def cut(self, i: int) -> None:
        """Take host ``i``'s link down: nothing passes until :meth:`mend`."""
        _ip("link", "set", self._port(i), "down")

    def mend(self, i: int) -> None:
        """Bring host ``i``'s link back up."""
        _ip("link", "set", self._port(i), "up")

    def kill(self, i: int) -> None:
        """Host ``i`` dies: every process in its namespace is killed, and its link goes down."""
        _kill_namespace(self.namespace(i))
        self.cut(i)

    # -- processes --------------------------------------------------------------------------------
    def argv(self, i: int, command: Sequence[str]) -> list[str]:
        """``command`` as run on host ``i``."""
        return ["ip", "netns", "exec", self.namespace(i), *command]

    def popen(self, i: int, command: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``command`` on host ``i`` (in a process group of its own); it is killed by :meth:`close`."""
        proc = subprocess.Popen(self.argv(i, command), start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, i: int, command: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``command`` on host ``i`` to its end."""
        return subprocess.run(self.argv(i, command), **kwargs)


__all__ = ["HostsUnavailable", "SimulatedHosts", "has_netem", "remove_stale", "unavailable"]
