"""Local backends: ``N`` workers as threads (ThreadCommunicator) or processes (gloo).

:class:`ThreadBackend` implements :class:`~irbis.train.backends.backend.Backend`;
:func:`run_threads` and :func:`run_processes` split the rows into ``N`` contiguous
shards and run the same :func:`irbis.train.loop.train_worker` as the Spark backend.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
from functools import partial
from typing import Any

import numpy as np
import torch

from irbis.train.backends.backend import Backend, Rank, RankFn, raise_returned
from irbis.train.comm import StoreCommunicator, ThreadCommunicator, connect_store, init_torch_group, serve_store
from irbis.train.loop import Report, TrainSpec, WorkerResult
from irbis.train.roles import run_rank
from irbis.train.strategies import make_strategy
from irbis.train.worker_data import Shard


def shard_rows(x: np.ndarray, y: np.ndarray, num_workers: int) -> list[Shard]:
    """Split rows into ``num_workers`` contiguous, nearly equal shards."""
    if num_workers < 1 or num_workers > len(y):
        raise ValueError(f"numWorkers must be in [1, {len(y)}] for {len(y)} rows, found {num_workers}")
    return [Shard(xs, ys) for xs, ys in zip(np.array_split(x, num_workers), np.array_split(y, num_workers))]


class ThreadBackend(Backend[Any]):
    """Ranks as threads of this process, joined by a :class:`~irbis.train.comm.ThreadCommunicator`.

    ``data`` is a list with one item per rank. A raised error aborts the other ranks' collectives
    and is re-raised here.
    """

    def __init__(self, num_workers: int, timeout: float = 300.0) -> None:
        super().__init__(num_workers)
        self.timeout = timeout

    def run(self, fn: RankFn, data: Any) -> list[Any]:
        if len(data) != self.num_workers:
            raise ValueError(f"ThreadBackend has {self.num_workers} workers but got {len(data)} shares of data")
        comms = ThreadCommunicator.group(self.num_workers, timeout=self.timeout)
        results: list[Any] = [None] * self.num_workers
        raised: list[BaseException] = []

        def work(rank: int) -> None:
            # One intra-op thread per worker, as Spark gives each task: with a pool shared between the
            # worker threads, kernels split their sums differently from run to run, and a strategy that
            # quantises (one_bit) turns those last-bit differences into different training runs.
            torch.set_num_threads(1)
            try:
                results[rank] = fn(Rank(rank, self.num_workers, comms[rank], data[rank]))
            except BaseException as err:
                raised.append(err)
                comms[rank].abort()

        threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(self.num_workers)]
        saved = torch.get_num_threads()
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            torch.set_num_threads(saved)
        if raised:
            raise next((e for e in raised if not isinstance(e, threading.BrokenBarrierError)), raised[0])
        return raise_returned(results)


def _train_rank(spec: TrainSpec, num_workers: int, report: Report | None, rank: Rank) -> WorkerResult:
    return run_rank(spec, num_workers, rank.data, rank.comm, rank.rank, spec.hardware.device, report=report)


def run_threads(spec: TrainSpec, shards: list[Shard], report: Report | None = None,
                timeout: float = 300.0) -> list[WorkerResult]:
    """Train with one thread per shard (and one per dedicated server after them); re-raises the first
    worker error."""
    from irbis.train.ps.driver import served

    strategy = make_strategy(spec.parallel.strategy, **spec.parallel.strategyOptions)
    servers = strategy.server_tasks(len(shards))
    with served(spec, strategy, len(shards)) as spec, ThreadBackend(len(shards) + servers, timeout) as backend:
        return backend.run(partial(_train_rank, spec, len(shards), report), list(shards) + [None] * servers)


def _process_main(spec: TrainSpec, num_workers: int, shard: Shard | None, rank: int, world: int, port: int,
                  out: Any, attempt: int = 0) -> None:
    store = connect_store("127.0.0.1", port, rank, world, 120.0)
    if spec.parallel.ps_endpoint is not None:  # elastic: collectives a restarted worker replays (see StoreCommunicator)
        import torch.distributed as dist

        comm: Any = StoreCommunicator(dist.PrefixStore("job", store), rank, world)
    else:
        comm = init_torch_group(store, rank, world, spec.hardware.device, 120.0)
    try:
        result = run_rank(spec, num_workers, shard, comm, rank, spec.hardware.device)
        result.info["attempt"] = attempt
        out.put((rank, result))
    except BaseException as err:
        out.put((rank, RuntimeError(f"worker {rank}: {type(err).__name__}: {err}")))


def run_processes(spec: TrainSpec, shards: list[Shard], retries: int = 0) -> list[WorkerResult]:
    """Train with one spawned process per shard (and one per dedicated server) over gloo (factories must
    be importable).

    Where the strategy places its shards on this process (``placement="driver"``), the workers exchange
    their collectives through the store instead, and a worker process that dies without a result is
    started again, up to ``retries`` times, as Spark retries a task: it rejoins the running job
    (``info["attempt"]`` counts its restarts).
    """
    from irbis.train.ps.driver import served

    strategy = make_strategy(spec.parallel.strategy, **spec.parallel.strategyOptions)
    data = list(shards) + [None] * strategy.server_tasks(len(shards))
    store = serve_store("127.0.0.1", len(data) + 1, 120.0)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with served(spec, strategy, len(shards)) as spec:
        def start(rank: int, attempt: int) -> Any:
            proc = ctx.Process(target=_process_main, daemon=True,
                               args=(spec, len(shards), data[rank], rank, len(data), store.port, out, attempt))
            proc.start()
            return proc

        procs = {r: start(r, 0) for r in range(len(data))}
        attempts = dict.fromkeys(procs, 0)
        results: dict[int, Any] = {}
        while len(results) < len(data):
            try:
                rank, result = out.get(timeout=0.2)
                results[rank] = result
                continue
            except queue.Empty:
                pass
            for r, p in procs.items():
                if r in results or p.is_alive() or p.exitcode == 0:
                    continue
                if spec.parallel.ps_endpoint is None or attempts[r] >= retries:
                    raise RuntimeError(f"worker {r} died (exit code {p.exitcode}) with no retry left")
                attempts[r] += 1
                procs[r] = start(r, attempts[r])
        for p in procs.values():
            p.join()
    for r in sorted(results):
        if isinstance(results[r], BaseException):
            raise results[r]
    return [results[r] for r in sorted(results)]
