"""One shard of the parameter server: weights, the server optimizer, versions, staleness, counters.

Pure numpy (torch only for a checkpoint's tensors) and no I/O: the transports
(:mod:`irbis.train.ps.transport` over ZeroMQ, :mod:`irbis.train.ps.in_process` in one process) only move
bytes to and from :meth:`ShardState.pull` and :meth:`ShardState.push`.

Every applied update bumps :attr:`ShardState.version`; its staleness is the number of
versions between the worker's last pull and the update, recorded in a histogram
(:data:`STALENESS_BINS` bins, the last one counting everything larger). A push whose
gradient has the wrong length, or that claims a version the shard never handed out,
is rejected; one whose sequence number was already applied (a resent message, or a
retried task replaying its steps) is acknowledged and counted as replayed, not applied
twice. Nothing is dropped without being counted.

:meth:`ShardState.state_dict` is what a checkpoint keeps of a shard (tensors and plain
values, read back with ``torch.load(weights_only=True)``): the weights, the optimizer and
delay-compensation state, the version, each worker's last pull and sequence number, and
the counters, so that a run resumed from the checkpoint neither loses nor repeats an update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from irbis.train.ps.rules import Rule, State, decayed, delay_compensate, server_rule

STALENESS_BINS = 32
#: Length of the job's random secret, under which every message to and from a shard is authenticated.
SECRET_BYTES = 32
APPLIED, REJECTED, REPLAYED = 0, 2, 3


@dataclass
class ShardState:
    """The server side of one contiguous range of the flat weight buffer.

    Parameters
    ----------
    weights : numpy.ndarray
        The shard's starting weights (float32, copied).
    optimizer : str
        A key of :data:`~irbis.train.ps.rules.SERVER_OPTIMIZERS` or a ``package.module:function`` rule
        (:func:`~irbis.train.ps.rules.server_rule`).
    lambda_ : float
        Delay-compensation strength (0: none).
    adaptive : bool
        DC-ASGD-a's adaptive λ.
    weight_decay : float
        L2 weight decay δ: each gradient gets ``δ w`` added before the rule (0: none).
    """

    weights: np.ndarray
    optimizer: str = "adagrad"
    lambda_: float = 0.0
    adaptive: bool = True
    weight_decay: float = 0.0
    version: int = 0
    opt_state: State = field(default_factory=dict)
    dc_state: State = field(default_factory=dict)
    pulled: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)
    staleness: np.ndarray = field(default_factory=lambda: np.zeros(STALENESS_BINS, dtype=np.int64))
    counts: dict[str, int] = field(default_factory=lambda: {"applied": 0, "rejected": 0, "replayed": 0})
    last_seq: dict[int, int] = field(default_factory=dict)
    rule: Rule = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.weights = np.array(self.weights, dtype=np.float32, copy=True)
        self.rule = server_rule(self.optimizer)

    def pull(self, worker: int) -> tuple[int, np.ndarray]:
        """The current version and weights (a copy); remembers them as ``worker``'s last pull."""
        snap = self.weights.copy()
        self.pulled[worker] = (self.version, snap if self.lambda_ else snap[:0])
        return self.version, snap

    def push(self, worker: int, seq: int, version: int, grad: np.ndarray, lr: float) -> int:
        """Apply one gradient; returns APPLIED, REJECTED or REPLAYED."""
        if grad.shape != self.weights.shape or not 0 <= version <= self.version:
            self.counts["rejected"] += 1
            return REJECTED
        if seq <= self.last_seq.get(worker, -1):
            self.counts["replayed"] += 1
            return REPLAYED
        self.last_seq[worker] = seq
        if self.lambda_:
            base = self.pulled.get(worker, (0, self.weights))[1]
            grad = delay_compensate(grad, self.weights, base, self.lambda_,
                                    self.dc_state if self.adaptive else None)
        self.rule(self.weights, decayed(grad, self.weights, self.weight_decay), lr, self.opt_state)
        self.staleness[min(self.version - version, STALENESS_BINS - 1)] += 1
        self.version += 1
        self.counts["applied"] += 1
        return APPLIED

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes as updates arrive, as tensors and plain values (see the module doc)."""
        return {"weights": _tensor(self.weights), "version": self.version,
                "optState": {k: _tensor(v) for k, v in self.opt_state.items()},
                "dcState": {k: _tensor(v) for k, v in self.dc_state.items()},
                "pulled": {w: (v, _tensor(a)) for w, (v, a) in self.pulled.items()},
                "staleness": _tensor(self.staleness), "counts": dict(self.counts), "lastSeq": dict(self.last_seq)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; ValueError if it was saved for another shard size."""
        weights = state["weights"].numpy()
        if weights.shape != self.weights.shape:
            raise ValueError(f"the checkpoint holds a shard of {weights.size} weights, this shard has "
                             f"{self.weights.size}; resume with the same numShards and network")
        self.weights = weights.copy()
        self.version = int(state["version"])
        self.opt_state = {k: v.numpy().copy() for k, v in state["optState"].items()}
        self.dc_state = {k: v.numpy().copy() for k, v in state["dcState"].items()}
        self.pulled = {int(w): (int(v), a.numpy().copy()) for w, (v, a) in state["pulled"].items()}
        self.staleness = state["staleness"].numpy().copy()
        self.counts = {k: int(v) for k, v in state["counts"].items()}
        self.last_seq = {int(w): int(q) for w, q in state["lastSeq"].items()}

    def stats(self) -> np.ndarray:
        """``[applied, rejected, replayed, *staleness histogram]`` as int64 (summed across shards)."""
        c = self.counts
        return np.concatenate([[c["applied"], c["rejected"], c["replayed"]], self.staleness]).astype(np.int64)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True))


__all__ = ["APPLIED", "REJECTED", "REPLAYED", "STALENESS_BINS", "ShardState"]
