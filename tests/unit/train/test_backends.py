"""The backend seam: the thread backend runs a function per rank, and raises returned or raised errors."""

from __future__ import annotations

import pytest
import torch

from irbis.train.backends.backend import Backend, Rank
from irbis.train.backends.local import ThreadBackend


def test_each_rank_gets_its_share_and_a_joined_communicator():
    with ThreadBackend(3) as backend:
        out = backend.run(lambda r: (r.rank, r.world_size, r.data, [float(t) for t in r.comm.all_gather(
            torch.tensor([float(r.data)]))]), data=[10, 20, 30])
    assert out == [(r, 3, d, [10.0, 20.0, 30.0]) for r, d in enumerate([10, 20, 30])]


def test_a_returned_error_is_raised_with_its_class_and_message():
    with ThreadBackend(2) as backend, pytest.raises(TypeError, match="bad labels"):
        backend.run(lambda r: TypeError("bad labels"), data=[None, None])


def test_a_raised_error_aborts_the_other_ranks_and_is_re_raised():
    def fn(r: Rank) -> None:
        if r.rank == 1:
            raise KeyError("rank 1 failed")
        r.comm.all_gather(torch.zeros(1))  # would wait for rank 1 forever without the abort

    with pytest.raises(KeyError, match="rank 1 failed"):
        ThreadBackend(2, timeout=30).run(fn, data=[None, None])


def test_backends_validate_eagerly():
    assert issubclass(ThreadBackend, Backend)
    with pytest.raises(ValueError, match="num_workers"):
        ThreadBackend(0)
    with pytest.raises(ValueError, match="2 workers but got 3"):
        ThreadBackend(2).run(lambda r: None, data=[1, 2, 3])


def test_an_elastic_job_refuses_speculative_copies_of_its_workers():
    # checked before any job starts, from the session's configuration alone
    from irbis.spark.barrier import SparkBarrierBackend

    class Conf:
        def get(self, key, default=None):
            return {"spark.speculation": "true", "spark.master": "local[2]"}.get(key, default)

    class Session:
        conf = Conf()

    with pytest.raises(ValueError, match="spark.speculation=true would start a second copy"):
        SparkBarrierBackend(Session(), 2, elastic=True)
