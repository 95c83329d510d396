"""Spark barrier backend: one barrier stage, one task per rank, torch.distributed inside.

:class:`SparkBarrierBackend` implements :class:`irbis.train.backends.backend.Backend`
with public DataFrame APIs only, so it runs on classic and Spark Connect sessions:
``df.mapInArrow(fn, schema, barrier=True)`` hands each task its partition as Arrow
record batches (no per-row Python objects), and every task joins a gloo (CPU) or
NCCL (CUDA) process group on a rendezvous ``TCPStore``, under a prefix unique to
the job and the stage attempt: handshakes, no sleeps.

Where the store lives:

* **classic session**: the driver serves it on a free port (executors reach the
  driver anyway). This is the faster way: a rendezvous through
  ``BarrierTaskContext.allGather`` costs about a second, as the first task to
  arrive polls for the answer once a second.
* **Spark Connect**: the client may be unreachable from the executors, so rank 0
  serves the store on its executor and shares its address with
  ``BarrierTaskContext.allGather``; a last ``barrier()`` keeps rank 0 (and its
  store) alive until every rank is done with it.

An *elastic* job (a strategy whose shards live on the driver, see :mod:`irbis.train.ps.driver`)
runs its ranks as an ordinary stage instead: each task joins the driver's store and exchanges its few
collectives through it (:class:`~irbis.train.comm.StoreCommunicator`), so a task that dies is retried
alone and rejoins while the others go on (Spark retries tasks up to ``spark.task.maxFailures`` times:
4 on a cluster, and on ``local[N, F]`` masters F).

A rank function's returned exception crosses as a JSON record
(:mod:`irbis.errors`) and is raised on the driver with its class and message. A
raised one fails the stage; Spark re-runs it and the workers resume from the last
checkpoint (on ``local[N]`` masters a failed task fails the job: Spark retries
tasks only on cluster masters).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from functools import partial
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from irbis.errors import executor_import_error, from_record, to_record
from irbis.spark.guard import on_executors
from irbis.spark.resources import conf, driver_host, local_slots, master
from irbis.spark.session import is_connect
from irbis.train.backends.backend import Backend, Rank, RankFn
from irbis.train.comm import StoreCommunicator, connect_store, init_torch_group, serve_store
from irbis.train.loop import WorkerResult

RESULT_SCHEMA = ("rank int, error string, history string, state binary, info string, loopSeconds double, "
                 "resumedFrom long")
_ARROW_RESULT = pa.schema([("rank", pa.int32()), ("error", pa.string()), ("history", pa.string()),
                           ("state", pa.binary()), ("info", pa.string()), ("loopSeconds", pa.float64()),
                           ("resumedFrom", pa.int64())])


_conf = conf


def available_slots(session: SparkSession, wanted: int = 0, wait_s: float = 30.0) -> int | None:
    """Tasks the cluster can run at once, or None when that cannot be known from here.

    ``local[N]`` masters answer at once (from ``spark.master`` and ``spark.task.cpus``: they never add
    executors); otherwise a classic session waits up to ``wait_s`` for executors to register (a
    ``local-cluster`` too, whose executors start as they may), and through Spark Connect only local
    masters are known.
    """
    local = local_slots(session)
    if is_connect(session) or (local is not None and not master(session).startswith("local-cluster")):
        return local
    jsc = session.sparkContext._jsc.sc()  # classic only: executors that registered so far

    def slots() -> int:
        try:
            return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
        except Exception:  # noqa: BLE001 - py4j surface differs across Spark versions
            return int(session.sparkContext.defaultParallelism)

    found, deadline, tick = slots(), time.monotonic() + wait_s, threading.Event()
    while found < wanted and time.monotonic() < deadline:
        tick.wait(0.25)
        found = slots()
    return found


def _rendezvous_store(ctx: Any, rank: int, world: int, driver: tuple[str, int] | None, timeout_s: float) -> Any:
    """The store: the driver's (classic), or rank 0's, announced by an all-gather (Connect)."""
    if driver is not None:
        return connect_store(driver[0], driver[1], rank, world, timeout_s)
    if rank == 0:
        host = ctx.getTaskInfos()[0].address.rsplit(":", 1)[0]
        store = serve_store(host, world, timeout_s)
        ctx.allGather(f"{host}:{store.port}")
        return store
    host, port = ctx.allGather("")[0].rsplit(":", 1)
    return connect_store(host, int(port), rank, world, timeout_s)


def _join(store: Any, job: str, rank: int) -> Any:
    """Prefix ``store`` by job and stage attempt (every task starts once per attempt, so the number of
    starts of this rank names the attempt the same way on every rank)."""
    import torch.distributed as dist

    attempt = store.add(f"{job}/starts/{rank}", 1)
    return dist.PrefixStore(f"{job}/{attempt}", store)


def _encode(rank: int, result: Any, info: dict[str, Any]) -> pa.RecordBatch:
    row: dict[str, Any] = {"rank": rank, "info": json.dumps(info)}
    if isinstance(result, BaseException):
        row["error"] = to_record(result)
    else:
        row.update(history=json.dumps(result.history), state=result.state, loopSeconds=result.loop_seconds,
                   resumedFrom=result.resumed_from, info=json.dumps({**result.info, **info}))
    return pa.RecordBatch.from_pylist([row], schema=_ARROW_RESULT)


def barrier_task(fn: RankFn, world: int, driver: tuple[str, int] | None, job: str, device: str,
                 timeout_s: float, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of each barrier task (module level, so it pickles by reference)."""
    import torch.distributed as dist
    from pyspark import BarrierTaskContext

    from irbis.kernels.device import task_device
    from irbis.spark.resources import assign_task_device

    t0 = time.perf_counter()
    ctx = BarrierTaskContext.get()
    assign_task_device(ctx)
    device = task_device(device)  # the GPU Spark assigned this rank, if any (the one device rule)
    rank = ctx.partitionId()
    store = _rendezvous_store(ctx, rank, world, driver, timeout_s)
    comm = init_torch_group(_join(store, job, rank), rank, world, device, timeout_s)
    t1 = time.perf_counter()
    try:
        host = ctx.getTaskInfos()[rank].address.rsplit(":", 1)[0]  # where Spark runs this task
        result = fn(Rank(rank, world, comm, batches, device, host))
    finally:
        dist.destroy_process_group()
    if driver is None:
        ctx.barrier()  # rank 0 serves the store: it stays until every rank is done with it
    yield _encode(rank, result, {"rendezvousSeconds": t1 - t0, "taskSeconds": time.perf_counter() - t0})


def elastic_task(fn: RankFn, world: int, driver: tuple[str, int] | None, job: str, device: str, timeout_s: float,
                 batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of each task of an elastic job (an ordinary stage): rank = partition, collectives through
    the driver's store, so that a retried attempt replays them and rejoins (module level, pickles by
    reference)."""
    import torch.distributed as dist
    from pyspark import TaskContext

    from irbis.kernels.device import task_device
    from irbis.spark.resources import assign_task_device

    t0 = time.perf_counter()
    ctx = TaskContext.get()
    assert ctx is not None and driver is not None  # a task of a classic session's job
    assign_task_device(ctx)
    device = task_device(device)
    rank = ctx.partitionId()
    store = connect_store(driver[0], driver[1], rank, world, timeout_s)
    comm = StoreCommunicator(dist.PrefixStore(job, store), rank, world)
    t1 = time.perf_counter()
    result = fn(Rank(rank, world, comm, batches, device))
    yield _encode(rank, result, {"rendezvousSeconds": t1 - t0, "taskSeconds": time.perf_counter() - t0,
                                 "attempt": ctx.attemptNumber()})


def _decode(rows: list[Any]) -> list[WorkerResult]:
    for r in rows:
        if r["error"]:
            raise from_record(r["error"])
    return [WorkerResult(r["rank"], json.loads(r["history"]), r["state"], r["loopSeconds"], r["resumedFrom"],
                         json.loads(r["info"])) for r in rows]


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a long (``Murmur3_x86_32.hashLong`` with the expression's seed, 42): the hash
    that hash partitioning (``repartition(n, col)``) takes ``pmod(_, n)`` of."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix(h: int, k: int) -> int:
        k = rotl((k * 0xCC9E2D51) & mask, 15) * 0x1B873593 & mask
        return (rotl(h ^ k, 13) * 5 + 0xE6546B64) & mask

    h = mix(mix(seed & mask, value & mask), (value >> 32) & mask) ^ 8
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & mask
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def partition_keys(n: int) -> dict[int, int]:
    """For each of ``n`` hash partitions, the smallest long key that Spark's hash partitioning sends there
    (``pmod(hash(key), n)``), computed here rather than by a Spark job."""
    found: dict[int, int] = {}
    key = 0
    while len(found) < n:
        found.setdefault(spark_hash_long(key) % n, key)  # Python's % of a positive n is Spark's pmod
        key += 1
    return found


class SparkBarrierBackend(Backend[WorkerResult]):
    """Ranks as the tasks of one Spark barrier stage over ``data`` (a DataFrame, one partition per rank).

    Parameters
    ----------
    session : SparkSession
        A classic or Spark Connect session.
    num_workers : int
        Ranks; the cluster must be able to run them all at once.
    device : str, default "cpu"
        Picks the process group's backend: gloo on CPU, NCCL on CUDA.
    timeout_s : float, default 600
        Rendezvous and collective timeout.
    data_ranks : int, optional
        Ranks that get rows (the first ones; default all): the others, dedicated parameter servers,
        get empty partitions.
    elastic : bool, default False
        Run the ranks as an ordinary stage, with their collectives through the driver's store, so that
        Spark retries a task that dies alone (a strategy whose shards live on the driver; classic
        sessions only, whose executors reach the driver).
    """

    def __init__(self, session: SparkSession, num_workers: int, device: str = "cpu",
                 timeout_s: float = 600.0, data_ranks: int | None = None, elastic: bool = False) -> None:
        super().__init__(num_workers)
        self.session, self.device, self.timeout_s, self.elastic = session, device, timeout_s, elastic
        self.data_ranks = num_workers if data_ranks is None else data_ranks
        self.connect = is_connect(session)
        if elastic and (_conf(session, "spark.speculation", "false") or "").lower() == "true":
            raise ValueError("placement='driver' runs each worker as one ordinary task, and spark.speculation=true "
                             "would start a second copy of a slow one beside it; turn speculation off for training")
        if elastic and self.connect:
            raise ValueError("placement='driver' (parameter-server shards on the driver) needs a classic session: "
                             "the executors of a Spark Connect session may not reach its client; use placement "
                             "'colocated' or 'dedicated'")
        self._store: Any = None

    def start(self) -> None:
        """Check the slots, and on a classic session serve the rendezvous store on the driver."""
        slots = available_slots(self.session, wanted=self.num_workers)
        if slots is not None and self.num_workers > slots:
            raise ValueError(f"{self._tasks()} but the cluster can run only {slots} tasks at once (a barrier "
                             f"stage needs all of them together); set numWorkers{self._servers_hint()} so that "
                             f"they make at most {slots}")
        if not self.connect:
            self._store = serve_store(driver_host(self.session), self.num_workers, self.timeout_s)

    def shutdown(self) -> None:
        self._store = None

    def _tasks(self) -> str:
        servers = self.num_workers - self.data_ranks
        if not servers:
            return f"numWorkers={self.num_workers}"
        return (f"numWorkers={self.data_ranks} and {servers} dedicated parameter servers need "
                f"{self.num_workers} barrier tasks")

    def _servers_hint(self) -> str:
        return " and numShards" if self.num_workers > self.data_ranks else ""

    def _partitioned(self, data: DataFrame) -> DataFrame:
        """``data`` as a shuffle into ``num_workers`` partitions, the rows spread over the first ``data_ranks``.

        Rows are dealt round-robin by row id: each gets a key that Spark's own hash partitioning
        (``pmod(hash(key), n)``, the expression ``repartition`` uses) sends to one of the first
        ``data_ranks`` partitions, keys found with that same expression on the driver. Unlike range
        bounds (drawn from a random sample), the split and each partition's row order (sorted by row
        id) depend only on the input, so a seeded run is repeatable, and a retried stage resumes on the
        batches its checkpoint was cut in.

        The row id is taken after each input partition is sorted by a hash of its rows' content: the
        id then depends on which rows a partition holds, not on their order. An input that comes out of
        a shuffle (``repartition``, a join) has no fixed order: its reduce side reads the map outputs in
        the order they arrive, local blocks first, so the same partition's rows come in another order on
        another executor or in a retried task.
        """
        n, used = self.num_workers, self.data_ranks
        found = partition_keys(n)
        if any(p not in found for p in range(used)):
            raise RuntimeError(f"no partitioning key found for {used} of {n} partitions")
        keys = F.array(*[F.lit(found[p]).cast("long") for p in range(used)])
        row = "__irbis_row"
        hashable = [c for c, t in data.dtypes if "map<" not in t]  # Spark refuses to hash a map
        if hashable:
            data = data.sortWithinPartitions(F.xxhash64(*[F.col(f"`{c}`") for c in hashable]))
        with_id = data.withColumn(row, F.monotonically_increasing_id())
        # the id is (input partition << 33) + row in that partition: deal each partition from its own
        # offset, so that many one-row partitions still spread over every rank
        start = F.shiftright(F.col(row), 33) + F.col(row).bitwiseAND(F.lit((1 << 33) - 1))
        slot = (start % used + 1).cast("int")
        return with_id.repartition(n, F.element_at(keys, slot)).sortWithinPartitions(row).drop(row)

    def _retriable(self) -> bool:
        master = _conf(self.session, "spark.master", "") or ""
        return not (master == "local" or (master.startswith("local[") and "," not in master))

    def run(self, fn: RankFn, data: DataFrame) -> list[WorkerResult]:
        if self._store is None and not self.connect:
            raise RuntimeError("SparkBarrierBackend.run needs start() first (or a `with` block)")
        driver = None if self.connect else (driver_host(self.session), self._store.port)
        body = elastic_task if self.elastic else barrier_task
        task = on_executors(partial(body, fn, self.num_workers, driver, uuid.uuid4().hex, self.device,
                                            self.timeout_s))
        # The barrier stage reads a shuffle of exactly num_workers partitions: a chain Spark always accepts
        # (one with a coalesce, union or limit inside the stage is refused), on classic and Connect alike.
        # (see _partitioned: round robin may leave a rank of a small frame with no rows).
        df = self._partitioned(data)
        try:
            rows = self._collect(df, task)
        except Exception as err:  # noqa: BLE001 - the JVM's error, wrapped by py4j or gRPC
            if (missing := executor_import_error(err)) is not None:
                raise missing from err
            elif any(m in str(err) for m in ("BarrierJobSlotsNumberCheckFailed", "SPARK-24819")):
                raise ValueError(f"{self._tasks()}: Spark could not run {self.num_workers} barrier tasks at "
                                 f"once; set numWorkers{self._servers_hint()} within the cluster's task slots "
                                 f"({str(err).splitlines()[0]})") from err
            else:
                raise
        return _decode(rows)

    def _collect(self, df: DataFrame, task: Any) -> list[Any]:
        if self.elastic:  # an ordinary stage: Spark retries a failed task alone
            return sorted(df.mapInArrow(task, RESULT_SCHEMA).collect(), key=lambda r: r["rank"])
        out = df.mapInArrow(task, RESULT_SCHEMA, barrier=True)
        # A shuffle after the barrier stage makes it a ShuffleMapStage, which Spark re-runs when a task
        # fails (a failed barrier ResultStage is never retried); local[N] never retries tasks anyway.
        return sorted((out.repartition(1) if self._retriable() else out).collect(), key=lambda r: r["rank"])


__all__ = ["RESULT_SCHEMA", "SparkBarrierBackend", "available_slots", "barrier_task", "elastic_task"]
