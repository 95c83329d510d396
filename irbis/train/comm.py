"""Collective communication for the training strategies.

A strategy talks to its peers only through a :class:`Communicator`: all-reduce
(mean), all-gather of equal-sized tensors, broadcast, a barrier, and
``gather_first`` (the first ``k`` tensors to arrive, for backup workers). Every
communicator counts the payload bytes this worker hands to collectives, so
bytes per step are measured rather than assumed.

Two implementations share the protocol:

* :class:`ThreadCommunicator` runs ``N`` workers as threads of one process
  (millisecond unit tests of every strategy, and the local thread backend);
* :class:`TorchCommunicator` wraps ``torch.distributed`` (gloo on CPU, NCCL on
  GPU) and the rendezvous ``TCPStore`` (used for ``gather_first``);
* :class:`StoreCommunicator` runs the few collectives of workers that are not
  in lockstep (asynchronous strategies whose shards live on the driver) through
  the rendezvous store alone, so that a worker retried after it died replays
  them and rejoins.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

T = TypeVar("T")

@runtime_checkable
class Communicator(Protocol):
    """What a strategy may ask of its peers; all calls are collective."""

    rank: int
    world_size: int
    bytes_sent: int
    late: bool  # set by gather_first

    def all_reduce_mean(self, tensor: torch.Tensor) -> None:
        """Replace ``tensor`` in place by the element-wise mean over workers."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """Replace ``tensor`` in place by the element-wise sum over workers."""

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Return every worker's ``tensor`` (same shape everywhere), in rank order."""

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Overwrite ``tensor`` in place with rank ``src``'s values."""

    def gather_first(self, tensor: torch.Tensor, k: int, tag: str) -> list[torch.Tensor]:
        """Return the first ``k`` tensors to arrive for ``tag`` (arrival order); sets :attr:`late` when this
        worker's tensor came after them (it was not used)."""

    def arrivals(self, tag: str) -> int:
        """How many workers have reached ``gather_first(..., tag)`` so far (not collective)."""

    def barrier(self) -> None:
        """Block until every worker has reached this call."""


class _Shared:
    """State shared by the threads of one :class:`ThreadCommunicator` group."""

    def __init__(self, world_size: int, timeout: float) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.slots: list[torch.Tensor | None] = [None] * world_size
        self.cond = threading.Condition()
        self.arrivals: dict[str, list[torch.Tensor]] = {}
        self.readers: dict[str, int] = {}
        self.objects: dict[str, object] = {}
        self.children: list[_Shared] = []  # subgroups, aborted with this group


class _Exchanging:
    """The collectives of a communicator built on one primitive, :meth:`_exchange` (every rank's tensor, in
    rank order), with the byte counts of the :class:`Communicator` protocol."""

    rank: int
    world_size: int
    bytes_sent: int

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError

    def _count(self, tensor: torch.Tensor) -> None:
        if self.world_size > 1:
            self.bytes_sent += tensor.numel() * tensor.element_size()

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        self._count(tensor)
        tensor.copy_(torch.stack(self._exchange(tensor)).sum(0))

    def all_reduce_mean(self, tensor: torch.Tensor) -> None:
        self.all_reduce_sum(tensor)
        tensor.div_(self.world_size)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self._count(tensor)
        return self._exchange(tensor)


class ThreadCommunicator(_Exchanging):
    """``N`` workers as threads of one process; build them with :meth:`group`.

    Examples
    --------
    >>> comms = ThreadCommunicator.group(2)
    >>> comms[1].rank, comms[1].world_size
    (1, 2)
    """

    def __init__(self, shared: _Shared, rank: int) -> None:
        self._shared = shared
        self.rank = rank
        self.world_size = shared.world_size
        self.bytes_sent = 0
        self.late = False

    @classmethod
    def group(cls, world_size: int, timeout: float = 60.0) -> list[ThreadCommunicator]:
        """Create the ``world_size`` communicators of one group, one per thread."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, found {world_size}")
        shared = _Shared(world_size, timeout)
        return [cls(shared, r) for r in range(world_size)]

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        s = self._shared
        s.slots[self.rank] = tensor.detach().clone()
        s.barrier.wait()
        out = list(s.slots)
        s.barrier.wait()
        return out  # type: ignore[return-value]

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        if self.rank == src:
            self._count(tensor)
        tensor.copy_(self._exchange(tensor)[src])

    def barrier(self) -> None:
        self._shared.barrier.wait()

    @property
    def aborted(self) -> bool:
        """Whether a worker of this group failed and aborted the group's collectives."""
        return self._shared.barrier.broken

    def abort(self) -> None:
        """Break this group's collectives and its subgroups' (a worker failed): every waiting peer raises."""
        pending = [self._shared]
        while pending:
            shared = pending.pop()
            shared.barrier.abort()
            pending.extend(shared.children)

    def subgroup(self, ranks: list[int]) -> ThreadCommunicator | None:
        """Collective: a communicator among ``ranks`` (their rank in it is their index there); None elsewhere.

        Every rank calls it once, and each may name the ranks of its own subgroup (disjoint subgroups,
        e.g. the mixed mode's groups of consecutive ranks)."""
        def build() -> list[ThreadCommunicator]:
            members = ThreadCommunicator.group(len(ranks), timeout=self._shared.timeout)
            self._shared.children.append(members[0]._shared)
            return members
        members = self.shared_object(f"subgroup/{list(ranks)}", build)
        return members[list(ranks).index(self.rank)] if self.rank in ranks else None

    def shared_object(self, key: str, factory: Callable[[], T]) -> T:
        """Collective: the one object of this group for ``key``, built by the first worker to ask.

        Threads only (e.g. the in-process parameter server); a barrier makes every worker see it.
        """
        s = self._shared
        with s.cond:
            if key not in s.objects:
                s.objects[key] = factory()
            obj = s.objects[key]
        s.barrier.wait()
        return obj  # type: ignore[return-value]

    def gather_first(self, tensor: torch.Tensor, k: int, tag: str) -> list[torch.Tensor]:
        s = self._shared
        with s.cond:
            got = s.arrivals.setdefault(tag, [])
            self.late = len(got) >= k
            if not self.late:
                got.append(tensor.detach().clone())
                self.bytes_sent += tensor.numel() * tensor.element_size()
                s.cond.notify_all()
            if not s.cond.wait_for(lambda: len(got) >= k, timeout=s.timeout):
                raise TimeoutError(f"gather_first({tag!r}): fewer than {k} arrivals")
            out = list(got[:k])
            s.readers[tag] = s.readers.get(tag, 0) + 1
            if s.readers[tag] == self.world_size:
                del s.arrivals[tag], s.readers[tag]
        return out

    def arrivals(self, tag: str) -> int:
        with self._shared.cond:
            return len(self._shared.arrivals.get(tag, ()))


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


class TorchCommunicator:
    """Collectives over an initialised ``torch.distributed`` process group.

    Parameters
    ----------
    store : torch.distributed.Store, optional
        The rendezvous store; needed only by :meth:`gather_first`.
    group : torch.distributed.ProcessGroup, optional
        A subgroup (see :meth:`subgroup`); the default group when None.
    """

    def __init__(self, store: torch.distributed.Store | None = None, group: Any = None) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("TorchCommunicator needs torch.distributed.init_process_group first")
        self._dist = dist
        self._store = store
        self._group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.bytes_sent = 0
        self.late = False

    def subgroup(self, ranks: list[int]) -> TorchCommunicator | None:
        """A communicator among ``ranks`` (this communicator's ranks; ``dist.new_group``); None elsewhere.

        Only the members synchronise (``use_local_synchronization``), so each rank may name the ranks of its
        own subgroup (disjoint subgroups, e.g. the mixed mode's groups), and a subgroup of a subgroup needs no
        call from the ranks outside it (the dedicated parameter servers)."""
        members = [self._global(r) for r in ranks]
        group = self._dist.new_group(members, use_local_synchronization=True)
        if self._dist.get_rank() not in members:
            return None
        store = None if self._store is None else self._dist.PrefixStore(f"subgroup/{list(ranks)}", self._store)
        return TorchCommunicator(store, group)

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        if self.world_size > 1:
            self.bytes_sent += tensor.numel() * tensor.element_size()
            self._dist.all_reduce(tensor, group=self._group)

    def all_reduce_mean(self, tensor: torch.Tensor) -> None:
        self.all_reduce_sum(tensor)
        if self.world_size > 1:
            tensor.div_(self.world_size)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.world_size == 1:
            return [tensor.clone()]
        self.bytes_sent += tensor.numel() * tensor.element_size()
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._dist.all_gather(out, tensor.contiguous(), group=self._group)
        return out

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        if self.world_size > 1:
            if self.rank == src:
                self.bytes_sent += tensor.numel() * tensor.element_size()
            self._dist.broadcast(tensor, self._global(src), group=self._group)

    def barrier(self) -> None:
        if self.world_size > 1:
            self._dist.barrier(group=self._group)

    def _global(self, rank: int) -> int:
        return rank if self._group is None else self._dist.get_global_rank(self._group, rank)

    def gather_first(self, tensor: torch.Tensor, k: int, tag: str) -> list[torch.Tensor]:
        """First ``k`` arrivals through the rendezvous store.

        Arrival order comes from the store's atomic counter; only the first ``k``
        workers upload their tensor, so a late worker never delays the others.
        The last reader deletes the keys.
        """
        if self._store is None:
            raise RuntimeError("gather_first needs the rendezvous store")
        store = self._store
        order = store.add(f"{tag}/n", 1)
        self.late = order > k
        if not self.late:
            store.set(f"{tag}/{order}", _tensor_bytes(tensor))  # type: ignore[arg-type]  # bytes are stored as they are
            self.bytes_sent += tensor.numel() * tensor.element_size()
        out = []
        for i in range(1, k + 1):
            raw = bytearray(store.get(f"{tag}/{i}"))
            out.append(torch.frombuffer(raw, dtype=tensor.dtype).view_as(tensor).to(tensor.device))
        if store.add(f"{tag}/read", 1) == self.world_size:
            for key in [f"{tag}/n", f"{tag}/read"] + [f"{tag}/{i}" for i in range(1, k + 1)]:
                store.delete_key(key)
        return out

    def arrivals(self, tag: str) -> int:
        if self._store is None:
            raise RuntimeError("arrivals needs the rendezvous store")
        return int(self._store.add(f"{tag}/n", 0))


class StoreCommunicator(_Exchanging):
    """Collectives through the rendezvous store, which a retried worker replays to rejoin its peers.

    The workers of an elastic job (see :meth:`~irbis.train.strategy.Strategy.elastic`) run as
    ordinary Spark tasks: a task that dies is retried alone while the others go on. They exchange
    little besides the parameter-server traffic (row counts, one record per epoch, the final
    buffers), and this communicator runs those exchanges through the driver's ``TCPStore``:

    * collective number ``i`` stores this rank's contribution under ``op<i>/<rank>`` *if no
      contribution is there yet* (``compare_set``), waits for every rank's key and computes the
      result from what is stored;
    * keys are never overwritten, so a retried worker, which starts again from its first
      collective, reads every completed one's original contributions and gets the very results its
      peers got, whatever it contributes now; at the first collective its peers are still waiting
      for, it contributes for real.

    The loop calls the same collectives in the same order on every attempt (see
    :func:`irbis.train.loop._run_epoch`), which is what makes a replay line up. A late
    ``gather_first`` (backup workers) belongs to lockstep strategies and is not offered.

    Parameters
    ----------
    store : torch.distributed.Store
        The rendezvous store, prefixed for this job.
    rank, world_size : int
    """

    def __init__(self, store: torch.distributed.Store, rank: int, world_size: int) -> None:
        self._store, self.rank, self.world_size = store, rank, world_size
        self.bytes_sent = 0
        self.late = False
        self._op = 0

    def _contribute(self, payload: bytes) -> list[bytes]:
        """This rank's ``payload`` for the next collective (unless an earlier attempt stored one); every
        rank's stored payload, once all are there."""
        self._op += 1
        keys = [f"op{self._op}/{r}" for r in range(self.world_size)]
        # one leading byte: an empty value would read as "no contribution yet" to compare_set
        self._store.compare_set(keys[self.rank], "", b"\x01" + payload)  # type: ignore[arg-type]  # bytes too
        self._store.wait(keys)
        return [raw[1:] for raw in self._store.multi_get(keys)]

    @staticmethod
    def _decode(raw: bytes, like: torch.Tensor) -> torch.Tensor:
        flat = torch.frombuffer(bytearray(raw), dtype=like.dtype) if raw else like.new_empty(0).cpu()
        return flat.view(like.shape).to(like.device)

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [self._decode(raw, tensor) for raw in self._contribute(_tensor_bytes(tensor))]

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        if self.rank == src:
            self._count(tensor)
        got = self._contribute(_tensor_bytes(tensor) if self.rank == src else b"")
        tensor.copy_(self._decode(got[src], tensor))

    def barrier(self) -> None:
        self._contribute(b"")

    def gather_first(self, tensor: torch.Tensor, k: int, tag: str) -> list[torch.Tensor]:
        raise NotImplementedError("gather_first (backup workers) needs workers in lockstep, not elastic ones")

    def arrivals(self, tag: str) -> int:
        raise NotImplementedError("arrivals (backup workers) needs workers in lockstep, not elastic ones")


def connect_store(host: str, port: int, rank: int, world_size: int, timeout_s: float) -> torch.distributed.TCPStore:
    """Join (``rank > 0``) the rendezvous ``TCPStore`` served by rank 0."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, world_size, False, timeout=datetime.timedelta(seconds=timeout_s))


def serve_store(host: str, world_size: int, timeout_s: float) -> torch.distributed.TCPStore:
    """Start the rendezvous ``TCPStore`` on a free port of ``host`` (rank 0)."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, world_size, True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def init_torch_group(store, rank: int, world_size: int, device: str, timeout_s: float) -> TorchCommunicator:
    """``init_process_group`` on ``store`` (gloo on CPU, NCCL on CUDA) and wrap it."""
    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return TorchCommunicator(store)


__all__ = ["Communicator", "StoreCommunicator", "ThreadCommunicator", "TorchCommunicator", "connect_store",
           "serve_store", "init_torch_group"]
