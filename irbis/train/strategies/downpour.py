"""Downpour SGD: asynchronous pushes of gradients to sharded parameter servers.

Dean, Corrado, Monga, Chen, Devin, Le, Mao, Ranzato, Senior, Tucker, Yang, Ng,
"Large Scale Distributed Deep Networks", NIPS 2012 (DistBelief).

Each worker ``i`` computes gradients on its last fetched copy of the weights,
accumulates them, pushes the sum every ``n_push`` steps and fetches fresh
weights every ``n_fetch`` steps; it never waits for its peers. Each shard ``s``
applies every push as it arrives with its own optimizer (Adagrad, the paper's
best setting, by default):

.. math::

    W^{(s)} \\leftarrow W^{(s)} - η\\,
    \\mathrm{rule}\\big(\\textstyle\\sum_{t \\in push} g_i^{(s)}(W_{pulled})\\big)

where the gradient was computed at weights :math:`τ` versions old (its
staleness, recorded per update). ``η`` is the local optimizer's current
learning rate (the estimator's ``learningRate`` and schedule); the local
optimizer itself is never stepped. The worker side here is shared by
:mod:`~irbis.train.strategies.mixed` (groups reduced synchronously) and
:mod:`~irbis.train.strategies.dcasgd` (delay-compensated server rule).

The shards run co-located (``placement="colocated"``: shard k on worker k mod N, in a thread of
its training task), on dedicated servers (``"dedicated"``: ``numShards`` extra barrier tasks,
one shard each, see :mod:`irbis.train.ps.dedicated`) or on the driver (``"driver"``: the workers
are ordinary tasks, and one that dies is retried alone, see :mod:`irbis.train.ps.driver`).

A checkpoint keeps, beside each worker's weights, the shards it hosts, its sequence
number, versions and unpushed accumulation (:meth:`Downpour.state_dict`); a run resumed
from it restores every shard before any worker pushes, so no update is lost or applied
twice (see :mod:`irbis.train.ps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from irbis.train import ps as param_server
from irbis.train.ps.dedicated import CUT, DONE
from irbis.train.ps.rules import rule_names, server_rule
from irbis.train.strategy import FlatParams, Strategy, WorkerContext


@dataclass
class State:
    """Gradients accumulated since the last push, and the parameter-server handle."""

    pending: torch.Tensor | None = None
    pushes: int = 0
    pushed_bytes: int = 0
    taken: int = 0
    lr: float = 0.0
    step: int = 0
    server: Any = field(default=None, repr=False)
    ctx: Any = field(default=None, repr=False)


PLACEMENTS = ("colocated", "dedicated", "driver")


def _positive_int(name: str, value: Any, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, found {value!r}")
    return value


def staleness_summary(hist: np.ndarray) -> dict[str, Any]:
    """Mean, median, 90th percentile and max staleness from a histogram (last bin: that many or more)."""
    n = int(hist.sum())
    if n == 0:
        return {"updates": 0}
    bins = np.arange(len(hist))
    cdf = np.cumsum(hist) / n
    return {"updates": n, "mean": float((hist * bins).sum() / n), "p50": int(np.searchsorted(cdf, 0.5)),
            "p90": int(np.searchsorted(cdf, 0.9)), "max": int(bins[hist > 0].max()),
            "histogram": [int(h) for h in hist]}


class Downpour(Strategy):
    """Asynchronous SGD on sharded parameter servers (Downpour).

    Parameters
    ----------
    fetchEvery : int, default 1
        Steps between fetches of the weights.
    pushEvery : int, default 1
        Steps between pushes of the accumulated gradient.
    serverOptimizer : str, default "adagrad"
        The shards' rule: a name of :data:`~irbis.train.ps.rules.SERVER_OPTIMIZERS` ("sgd", "momentum",
        "adagrad", "rmsprop") or a ``"package.module:function"`` rule ``f(w, g, lr, state)`` that every
        worker can import (see :mod:`irbis.train.ps.rules`).
    numShards : int, default 0
        Shards of the weight buffer. 0: one per worker; co-located, none smaller than
        :data:`~irbis.train.ps.rules.MIN_SHARD_WEIGHTS` weights (a small network gets fewer).
    placement : str, default "colocated"
        Where the shards run: "colocated" (shard k on worker k mod N), "dedicated" (one extra
        barrier task per shard, which trains nothing) or "driver" (threads of the driver process:
        the workers run as ordinary tasks, and one that dies is retried alone and rejoins from the
        shards' current weights, see :mod:`irbis.train.ps.driver`).
    serverWeightDecay : float, default 0.0
        L2 weight decay δ applied by the shards: each gradient gets ``δ w`` added before the rule (the ICCS
        2017 experiment's regularisation, δ = 1e-4).

    Examples
    --------
    >>> Downpour(fetchEvery=2)  # doctest: +NORMALIZE_WHITESPACE
    Downpour(fetchEvery=2, pushEvery=1, serverOptimizer='adagrad', numShards=0, placement='colocated',
             serverWeightDecay=0.0)
    """

    name = "downpour"
    owns_update = True

    def __init__(self, fetchEvery: int = 1, pushEvery: int = 1, serverOptimizer: str = "adagrad",
                 numShards: int = 0, placement: str = "colocated", serverWeightDecay: float = 0.0) -> None:
        self.fetchEvery = _positive_int("fetchEvery", fetchEvery)
        self.pushEvery = _positive_int("pushEvery", pushEvery)
        if not isinstance(serverOptimizer, str):
            raise ValueError(f"serverOptimizer must be one of {rule_names()}, found {serverOptimizer!r}")
        server_rule(serverOptimizer)  # a bad name, or a rule that does not import, fails here
        self.serverOptimizer = serverOptimizer
        if (isinstance(serverWeightDecay, bool) or not isinstance(serverWeightDecay, (int, float))
                or not serverWeightDecay >= 0):
            raise ValueError(f"serverWeightDecay must be a number >= 0, found {serverWeightDecay!r}")
        self.serverWeightDecay = float(serverWeightDecay)
        self.numShards = _positive_int("numShards", numShards, low=0)
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {list(PLACEMENTS)}, found {placement!r}")
        self.placement = placement
        self.state = State()

    def options(self) -> dict[str, Any]:
        return {"fetchEvery": self.fetchEvery, "pushEvery": self.pushEvery,
                "serverOptimizer": self.serverOptimizer, "numShards": self.numShards, "placement": self.placement,
                "serverWeightDecay": self.serverWeightDecay}

    def server_tasks(self, num_workers: int) -> int:
        """``numShards`` (0: one per worker) dedicated servers, or none when co-located."""
        return (self.numShards or num_workers) if self.placement == "dedicated" else 0

    def elastic(self) -> bool:
        """Whether the shards live on the driver, so that the workers need no barrier stage."""
        return self.placement == "driver"

    def shard_options(self, ctx: WorkerContext | None) -> dict[str, Any]:
        """What every shard is built with (the subclasses add grouping or delay compensation)."""
        return {"optimizer": self.serverOptimizer, "weight_decay": self.serverWeightDecay}

    def setup(self, flat: FlatParams, ctx: WorkerContext) -> None:
        if flat.weights.device.type != "cpu":
            raise ValueError(f"{self.name} runs on CPU tensors; found the model on {flat.weights.device}")
        sizes = [p.numel() for p in flat.params]
        self.state.server = param_server.start(flat.weights.numpy(), sizes, ctx, self.numShards,
                                               **self.shard_options(ctx))
        self.state.ctx = ctx
        self.state.pending = torch.zeros_like(flat.grads) if self.pushEvery > 1 else None

    def update(self, flat: FlatParams, ctx: WorkerContext, step: int, lr: float) -> None:
        fetch = step % self.fetchEvery == 0
        if self.state.pending is not None:
            self.state.pending.add_(flat.grads)
            self.state.pushes += 1
        if step % self.pushEvery == 0:
            grads = flat.grads if self.state.pending is None else self.state.pending
            self.push(grads, lr, flat.weights if fetch else None)
            if self.state.pending is not None:
                self.state.pending.zero_()
                self.state.pushes = 0
        elif fetch:
            self.pull(flat.weights)
        self.state.lr, self.state.step = lr, step
        self.state.taken += 1

    def push(self, grads: torch.Tensor, lr: float, pull_into: torch.Tensor | None = None) -> None:
        """Send ``grads`` to the shards (and, with ``pull_into``, copy the updated weights back into it);
        the bytes count in this worker's bytes per step. :class:`~irbis.train.strategies.mixed.MixedSync`
        averages its group's gradients first and lets the group's leader alone push."""
        self.state.server.client.push(grads.numpy(), lr, None if pull_into is None else pull_into.numpy())
        nbytes = grads.numel() * grads.element_size()
        self.state.ctx.comm.bytes_sent += nbytes  # bytes per step count the pushes
        self.state.pushed_bytes += nbytes

    def pull(self, weights: torch.Tensor) -> None:
        """Copy the shards' current weights into ``weights`` (the flat weight buffer)."""
        self.state.server.client.pull(weights.numpy())

    def job_steps(self) -> int | None:
        """Shard 0's version as of this worker's last reply, times ``pushEvery``: every push reaches every
        shard and is one version. None where the client's requests take turns in rank order (workers as
        threads)."""
        server = self.state.server
        if server is None or not server.client.free_running:
            return None
        return server.client.versions[0] * self.pushEvery

    def summary(self, ctx: WorkerContext) -> dict[str, Any]:
        if self.state.server is None:
            return {}
        delta = self.state.server.stats_delta(ctx.comm)
        sent = torch.tensor([self.state.pushed_bytes, self.state.taken], dtype=torch.float64)
        ctx.comm.all_reduce_sum(sent)
        self.state.pushed_bytes = self.state.taken = 0
        return {"psUpdates": {"pushed": int(delta[-1]), "applied": int(delta[0]), "rejected": int(delta[1]),
                              "replayed": int(delta[2])},
                "staleness": staleness_summary(delta[3:-1]),
                # the bytes sent to the shards over every worker's steps of the epoch
                "pushedBytesPerStep": float(sent[0] / max(float(sent[1]), 1.0))}

    def state_dict(self) -> dict[str, Any]:
        """The hosted shards, the client's position and the unpushed accumulation (at a consistent cut)."""
        if self.state.server is None:
            return {}
        self.state.server.control(CUT, self.state.step)  # dedicated servers save their shards at this cut
        return {"server": self.state.server.state_dict(), "pending": self.state.pending,
                "pushes": self.state.pushes, "lr": self.state.lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Collective: restore :meth:`state_dict`, then wait until every worker restored its shards."""
        if not state:
            return
        self.state.server.load_state_dict(state["server"])
        if state["pending"] is not None:
            assert self.state.pending is not None  # made by setup()
            self.state.pending.copy_(state["pending"])
        self.state.pushes, self.state.lr = int(state["pushes"]), float(state["lr"])
        self.state.ctx.comm.barrier()  # no push reaches a shard before it is restored

    def finalize(self, flat: FlatParams, ctx: WorkerContext) -> None:
        server = self.state.server
        if server is None:
            return
        if self.state.pushes:  # the last partial accumulation is pushed, not lost
            assert self.state.pending is not None  # made by setup()
            self.push(self.state.pending, self.state.lr)
        ctx.comm.barrier()
        self.pull(flat.weights)
        ctx.comm.barrier()
        server.control(DONE)  # every worker holds the final weights: the dedicated servers may stop
        self.close()

    def close(self) -> None:
        """Stop the dedicated servers if finalize did not (training stopped early) and close the connections."""
        server, self.state.server = self.state.server, None
        if server is None:
            return
        try:
            server.control(DONE)
        except (OSError, TimeoutError, ValueError):
            pass  # an error is already on its way up; a server left waiting fails with its stage
        finally:
            server.close()
