"""The peers the training benchmarks measure in the same run as Irbis: sparktorch and its helpers.

sparktorch 0.2.0 (``pip install irbis[bench]``) trains a module on Spark in two modes:

* ``synchronous``: one barrier stage, each task samples a random minibatch every iteration and
  all-reduces its gradients over gloo (the mean), then steps its own optimizer;
* ``hogwild``: each task pulls the whole ``state_dict`` from a Flask server on the driver over HTTP,
  computes a gradient and posts it back, where the server's optimizer steps; ``fit`` sleeps a fixed
  5 s after starting the server. Its workers never zero their gradients, so each push carries the sum
  of all of that worker's gradients so far: its learning rate wants its own sweep.

``iters`` is per task in both modes, so ``epochs * rows / global batch`` iterations of ``global
batch / workers`` rows per task give the same samples as an epoch-based run. Two shims, here only:
the optimizer is handed over as a factory from this module, shipped to the Spark workers with
``addPyFile`` (dill 0.4 cannot pickle ``torch.optim.SGD`` by reference under torch 2.13, as
``torch.optim`` has no attribute ``sgd``), and the session is the caller's (its workers run this
interpreter). When sparktorch is missing, :func:`sparktorch_fit` raises ``PeerNotRun`` with the reason.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from irbis.spark.standalone import free_port


class PeerNotRun(RuntimeError):
    """A peer that could not run here; its message is the reason printed in the row's place."""


def digits_frame(spark: Any, x: np.ndarray, y: np.ndarray, partitions: int = 2) -> Any:
    """A cached DataFrame of ``features`` (dense vectors) and ``label`` (double) in ``partitions`` parts."""
    from pyspark.ml.linalg import Vectors

    df = spark.createDataFrame([(Vectors.dense(a.astype(float)), float(b)) for a, b in zip(x, y)],
                               ["features", "label"]).repartition(partitions).cache()
    df.count()
    return df


def make_optimizer(params: Any, name: str, lr: float) -> torch.optim.Optimizer:
    """``torch.optim.SGD`` or ``torch.optim.Adam`` over ``params`` at ``lr``: sparktorch's optimizer factory."""
    import torch  # the Spark workers unpickle this function without this module's globals

    return (torch.optim.Adam if name == "adam" else torch.optim.SGD)(params, lr=lr)


_SHIPPED: set[int] = set()


def _ship_to_workers(sc: Any) -> None:
    """Put this module on the Spark workers' path once per context (the optimizer factory lives here)."""
    if id(sc) not in _SHIPPED:
        sc.addPyFile(__file__)
        _SHIPPED.add(id(sc))


def sparktorch_fit(df: Any, module: torch.nn.Module, mode: str, optimizer: str, lr: float, iters: int,
                   workers: int = 2, global_batch: int = 64) -> tuple[torch.nn.Module, float]:
    """Train ``module`` with sparktorch in ``mode`` on ``df``; returns the trained module and the wall seconds
    of ``fit`` (end to end: the Spark job and, for hogwild, the server's start-up sleep).

    Raises
    ------
    PeerNotRun
        When sparktorch is not installed.
    """
    try:
        from sparktorch import SparkTorch, serialize_torch_obj
    except ImportError as err:
        raise PeerNotRun(f"sparktorch is not installed ({err}); pip install 'irbis[bench]'") from None
    _ship_to_workers(df.sparkSession.sparkContext)
    obj = serialize_torch_obj(module, torch.nn.CrossEntropyLoss(), make_optimizer, name=optimizer, lr=lr)
    est = SparkTorch(inputCol="features", labelCol="label", predictionCol="pred", torchObj=obj, iters=iters,
                     mode=mode, partitions=workers, port=free_port(), miniBatch=global_batch // workers, verbose=0)
    t0 = time.perf_counter()
    trained = est.fit(df).getPytorchModel()
    return trained, time.perf_counter() - t0


def not_run(name: str, err: BaseException) -> str:
    """The line printed in place of a peer's row that did not run."""
    return f"{name}: not run: {type(err).__name__}: {err}"
