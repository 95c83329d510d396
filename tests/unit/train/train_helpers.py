"""Shared helpers: run N strategy workers as threads on a tiny regression problem."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from irbis.train.comm import ThreadCommunicator
from irbis.train.strategy import DistributedOptimizer, FlatParams, Strategy, WorkerContext


def tiny_net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def tiny_data(n: int = 64, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, torch.randn(n, 3, generator=g)


def in_threads(world: int, work: Callable[[int, ThreadCommunicator], object]) -> list:
    """``work(rank, comm)`` on ``world`` threads, each with its communicator of one group; returns each
    rank's result. A worker that raises aborts the group's barrier (its peers stop waiting) and is raised."""
    comms = ThreadCommunicator.group(world, timeout=30)
    out: list = [None] * world
    errors: list = []

    def run(rank: int) -> None:
        try:
            out[rank] = work(rank, comms[rank])
        except BaseException as err:  # surfaced below
            errors.append(err)
            comms[rank]._shared.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def run_workers(world: int, make_strategy: Callable[[], Strategy], steps: int, batch: int = 8,
                opt: Callable = lambda p: torch.optim.SGD(p, lr=0.1)
                ) -> list[tuple[torch.nn.Module, DistributedOptimizer]]:
    """Each worker r trains on rows r::world of a fixed dataset; returns (model, dopt) per worker."""
    x, y = tiny_data()
    # Different starts (setup must broadcast rank 0's), built before the threads: seeding torch's
    # global RNG from several threads at once would give timing-dependent weights.
    models = [tiny_net(seed=rank) for rank in range(world)]

    def work(rank: int, comm: ThreadCommunicator) -> tuple[torch.nn.Module, DistributedOptimizer]:
        model = models[rank]
        flat = FlatParams(list(model.parameters()))
        dopt = DistributedOptimizer(opt(model.parameters()), make_strategy(), WorkerContext(comm, rank, world), flat)
        xs, ys = x[rank::world], y[rank::world]
        for s in range(steps):
            i = (s * batch) % len(xs)
            dopt.zero_grad()
            torch.nn.functional.mse_loss(model(xs[i:i + batch]), ys[i:i + batch]).backward()
            dopt.step()
        dopt.finalize()
        return model, dopt

    return in_threads(world, work)


def plain_sgd(steps: int, batch: int = 8, opt: Callable = lambda p: torch.optim.SGD(p, lr=0.1)) -> torch.nn.Module:
    """Single-process reference on the full data in the same order as world=1 workers."""
    model = tiny_net(seed=0)
    o = opt(model.parameters())
    x, y = tiny_data()
    for s in range(steps):
        i = (s * batch) % len(x)
        o.zero_grad()
        torch.nn.functional.mse_loss(model(x[i:i + batch]), y[i:i + batch]).backward()
        o.step()
    return model


def weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


class CrashOnce:
    """An ``augment`` hook that passes batches through and, once :meth:`arm` is called, raises at its
    ``at``-th call after that: a worker dying mid-epoch (the crash-and-resume tests)."""

    def __init__(self, at: int) -> None:
        self.at, self.calls, self.armed = at, 0, False
        self.lock = threading.Lock()

    def arm(self) -> None:
        with self.lock:
            self.calls, self.armed = 0, True

    def __call__(self, batch, rng):
        with self.lock:
            self.calls += 1
            if self.armed and self.calls == self.at:
                self.armed = False
                raise RuntimeError("injected failure")
        return batch


def token_task(n: int = 240, seed: int = 0, vocab: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length token-id rows (lengths 3-40, ids 1..vocab-1) labelled by whether token 7 occurs
    (half of them, at a random place): an object array of int64 rows and the labels."""
    rng = np.random.default_rng(seed)
    others = np.array([t for t in range(1, vocab) if t != 7])
    rows, labels = np.empty(n, dtype=object), rng.integers(0, 2, n)
    for i in range(n):
        row = rng.choice(others, rng.integers(3, 41))
        if labels[i]:
            row[rng.integers(0, len(row))] = 7
        rows[i] = row.astype(np.int64)
    return rows, labels


def peak_rss_mib(script: str, sizes: tuple[int, ...]) -> dict[int, float]:
    """Run ``script`` (Python source taking a row count as its argument, printing ``rows seen`` and
    ``ru_maxrss`` in KiB) in a fresh interpreter for each of ``sizes``: its peak RSS in MiB by size. Each
    run must exit cleanly and have seen its rows twice (two epochs)."""
    import subprocess
    import sys

    peaks = {}
    for rows in sizes:
        done = subprocess.run([sys.executable, "-c", script, str(rows)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        seen, peak_kib = map(int, done.stdout.split())
        assert seen == 2 * rows
        peaks[rows] = peak_kib / 1024
    return peaks


def signed_sgd(w: np.ndarray, g: np.ndarray, lr: float, state: dict) -> None:
    """A custom parameter-server rule (``serverOptimizer="train_helpers:signed_sgd"``): signSGD, counting its
    updates in ``state["n"]``."""
    n = state.setdefault("n", np.zeros((), dtype=np.int64))
    n += 1
    w -= np.float32(lr) * np.sign(g)
