"""A dedicated parameter server: the body of a barrier task that hosts one shard and trains nothing.

With ``placement="dedicated"`` the job runs ``N`` workers (ranks ``0..N-1``) and ``K`` servers
(rank ``N + i`` hosts shard ``i``) in one barrier stage. Every rank first joins the collectives of
:func:`irbis.train.ps.connect` over the whole stage; then the servers only serve, while the workers'
own collectives (all-reduces, barriers, the final weights) run in a subgroup of the workers.

Rank 0 drives the servers with two CONTROL messages, each sent once every worker has reached a
barrier (so no push is in flight):

* ``CUT`` at a checkpoint: each server saves its shard (:meth:`ParameterServer.state_dict`) beside
  the workers' files of that step, before rank 0 commits the step;
* ``DONE`` once every worker has pulled the final weights (or training stopped): the server closes.

On a resumed run each server restores its shard from the committed step before any worker pushes.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from irbis.train import checkpoint as ckpt
from irbis.train.ps import DONE, Layout, ParameterServer, connect

CUT = 1
POLL_S = 0.1  # how often a waiting server looks whether its thread group was aborted


def serve(comm: Any, rank: int, num_workers: int, num_shards: int, sizes: list[int],
          shard_options: dict[str, Any], checkpoint_dir: str | None, host: str = "127.0.0.1") -> dict[str, Any]:
    """Collective with the workers' :func:`~irbis.train.ps.start`: serve shard ``rank - N`` until DONE.

    Returns what the server did: its shard, and the checkpoint cuts it saved.
    """
    import torch

    weights = torch.zeros(int(sum(sizes)), dtype=torch.float32)
    comm.broadcast(weights, src=0)  # rank 0's starting weights
    done, cuts = threading.Event(), []

    def on_control(command: int, step: int) -> None:
        if command == CUT and checkpoint_dir:
            ckpt.save_worker(checkpoint_dir, step, rank, {"server": ps.state_dict()})
            cuts.append(step)
        elif command == DONE:
            done.set()

    manifest = ckpt.latest(checkpoint_dir)
    restore = (None if manifest is None or not checkpoint_dir
               else ckpt.load_worker(checkpoint_dir, manifest["step"], rank)["server"])
    layout = Layout(comm, num_workers, num_shards, dedicated=True)
    ps: ParameterServer = connect(layout, rank, weights.numpy(), sizes, host, shard_options, on_control, restore)
    try:
        while not done.wait(POLL_S):
            if getattr(comm, "aborted", False):
                raise threading.BrokenBarrierError(f"parameter server {rank}: a worker failed")
    finally:
        ps.close()
    shard = ps.shard_states()
    return {"role": "server", "shards": sorted(shard), "cuts": cuts,
            "version": int(np.sum([s.version for s in shard.values()]))}


__all__ = ["CUT", "DONE", "serve"]
