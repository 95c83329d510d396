"""Server-side update rules of the parameter server, pure numpy.

A shard of ``n`` weights applies each gradient it receives with one of the
rules of :data:`SERVER_OPTIMIZERS` (``w`` the shard's weights, ``g`` the
gradient, ``η`` the learning rate the worker sent with it):

* ``sgd``: :math:`w \\leftarrow w - η g`;
* ``momentum``: :math:`v \\leftarrow μ v + g,\\; w \\leftarrow w - η v` (μ = 0.9);
* ``adagrad``: :math:`h \\leftarrow h + g \\odot g,\\; w \\leftarrow w - η\\, g / (\\sqrt{h} + ε)`,
  Downpour's best setting in Dean et al. 2012;
* ``rmsprop``: :math:`m \\leftarrow ρ m + (1 - ρ)\\, g \\odot g,\\; w \\leftarrow w - η\\, g / \\sqrt{m + ε}`
  (Tieleman and Hinton 2012) with the ICCS 2017 mixed-mode experiment's constants, ρ = 0.9 and ε = 1
  (Campos et al., Section 5: "RMSProp ... decay of 0.9 and ε = 1.0"); ε is inside the square root, as in the
  TensorFlow optimizer that experiment ran, and ``m`` starts at zero.

A rule may also be named ``"package.module:function"`` (:mod:`irbis.refs`): a function of the
built-in rules' signature, ``f(w, g, lr, state)``, which updates the float32 array ``w`` in place
and keeps what it needs between updates in the dict ``state`` (numpy arrays only, so that a checkpoint
holds them); every worker must be able to import it. :func:`server_rule` resolves a name to its rule.

Weight decay (the server option ``weight_decay``, the strategies' ``serverWeightDecay``) adds the
gradient of an L2 term :math:`\\frac{δ}{2} \\lVert w \\rVert^2` to every gradient before the rule,
:math:`g \\leftarrow g + δ\\, w` at the shard's current weights, as the ICCS experiment regularised its
loss (δ = 1e-4); see :func:`decayed`.

Delay compensation (Zheng et al., "Asynchronous Stochastic Gradient Descent
with Delay Compensation", ICML 2017) corrects a gradient computed at the
weights ``W_pulled`` a worker last fetched before the rule sees it:

.. math:: \\tilde g = g + λ\\, g \\odot g \\odot (W_{now} - W_{pulled})

and DC-ASGD-a scales λ element-wise by the running mean square of the
gradients, :math:`M \\leftarrow m M + (1 - m) g \\odot g`,
:math:`λ_t = λ_0 / \\sqrt{M + ε}` (m = 0.95).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from irbis.refs import is_reference, resolve

MOMENTUM = 0.9
EPS = 1e-8
MEAN_SQUARE_DECAY = 0.95
#: RMSProp's decay ρ and ε (inside the square root), the ICCS 2017 experiment's
RMSPROP_DECAY, RMSPROP_EPS = 0.9, 1.0

State = dict[str, np.ndarray]
Rule = Callable[[np.ndarray, np.ndarray, float, State], None]


def sgd(w: np.ndarray, g: np.ndarray, lr: float, state: State) -> None:
    """Plain SGD, in place."""
    w -= np.float32(lr) * g


def momentum(w: np.ndarray, g: np.ndarray, lr: float, state: State) -> None:
    """Heavy-ball momentum (μ = 0.9), in place; keeps ``state["v"]``."""
    v = state.setdefault("v", np.zeros_like(w))
    v *= np.float32(MOMENTUM)
    v += g
    w -= np.float32(lr) * v


def adagrad(w: np.ndarray, g: np.ndarray, lr: float, state: State) -> None:
    """Adagrad, in place; keeps the sum of squared gradients in ``state["h"]``."""
    h = state.setdefault("h", np.zeros_like(w))
    h += g * g
    w -= np.float32(lr) * g / (np.sqrt(h) + np.float32(EPS))


def rmsprop(w: np.ndarray, g: np.ndarray, lr: float, state: State) -> None:
    """RMSProp (ρ = 0.9, ε = 1 inside the square root), in place; keeps the running mean square in
    ``state["ms"]``."""
    ms = state.setdefault("ms", np.zeros_like(w))
    ms *= np.float32(RMSPROP_DECAY)
    ms += np.float32(1 - RMSPROP_DECAY) * g * g
    w -= np.float32(lr) * g / np.sqrt(ms + np.float32(RMSPROP_EPS))


#: The server rules by name: the one registry the strategies' ``serverOptimizer`` is checked against.
SERVER_OPTIMIZERS: dict[str, Rule] = {"sgd": sgd, "momentum": momentum, "adagrad": adagrad, "rmsprop": rmsprop}


def rule_names() -> str:
    """What ``serverOptimizer`` accepts, in words (for errors and docs)."""
    return ", ".join(repr(k) for k in SERVER_OPTIMIZERS) + " or 'package.module:function'"


def server_rule(name: str) -> Rule:
    """The rule ``name`` names: a key of :data:`SERVER_OPTIMIZERS` or a ``package.module:function``
    reference, imported here; ValueError naming ``serverOptimizer`` otherwise."""
    if name in SERVER_OPTIMIZERS:
        return SERVER_OPTIMIZERS[name]
    if not is_reference(name):
        raise ValueError(f"serverOptimizer must be one of {rule_names()}, found {name!r}")
    try:
        rule = resolve(name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"serverOptimizer {name!r} cannot be imported ({err}); a custom rule must be importable "
                         "by every worker") from None
    if not callable(rule):
        raise ValueError(f"serverOptimizer {name!r} is not a function f(w, g, lr, state)")
    return rule


def decayed(g: np.ndarray, w: np.ndarray, weight_decay: float) -> np.ndarray:
    """``g + weight_decay * w`` (a new array), or ``g`` itself when ``weight_decay`` is 0."""
    return g + np.float32(weight_decay) * w if weight_decay else g


def delay_compensate(g: np.ndarray, w_now: np.ndarray, w_pulled: np.ndarray, lambda_: float,
                     state: State | None = None, bias_correction: bool = False) -> np.ndarray:
    """The delay-compensated gradient; with ``state`` (a dict) DC-ASGD-a's adaptive λ.

    The running mean square ``state["meanSquare"]`` starts at zero, as in Zheng et al., so the first
    updates see λ over-estimated by :math:`1 / \\sqrt{1 - m^t}` (4.5x at the first, 1.25x at the 20th).
    ``bias_correction`` divides it by :math:`1 - m^t` (as Adam does its moments; ``state["updates"]``
    counts ``t``). It is off: on the digits MLP under plain SGD the compensation is under 1% of the
    gradient's norm and the test accuracy was the same with and without it (see
    ``benchmarks/dcasgd_defaults.py``). Returns ``g`` itself (not a copy) when ``lambda_ == 0``, so
    that DC-ASGD with λ = 0 is the uncompensated rule bit for bit.
    """
    if lambda_ == 0:
        return g
    lam: np.ndarray | np.float32 = np.float32(lambda_)
    if state is not None:
        ms = state.setdefault("meanSquare", np.zeros_like(g))
        ms *= np.float32(MEAN_SQUARE_DECAY)
        ms += np.float32(1 - MEAN_SQUARE_DECAY) * g * g
        scale = np.float32(1)
        if bias_correction:
            count = state.setdefault("updates", np.zeros((), dtype=np.int64))
            count += 1
            scale = np.float32(1 - MEAN_SQUARE_DECAY ** min(int(count), 1000))
        lam = np.float32(lambda_) / np.sqrt(ms / scale + np.float32(EPS))
    return g + lam * g * g * (w_now - w_pulled)


#: The fewest weights a co-located shard gets by default (256 KiB of float32). Each shard costs every
#: step a message each way, whose fixed cost (the Python and ZeroMQ path, a thread wake-up, the MAC's
#: set-up) is worth paying only where it splits a transfer long enough to gain from it: on digits'
#: 9,610-weight MLP, 4 workers (one slowed 3x) took 1.4x the steps per second with one shard as with four.
MIN_SHARD_WEIGHTS = 1 << 16


def default_shards(total: int, workers: int) -> int:
    """``numShards=0`` with co-located shards: one per worker, but none below :data:`MIN_SHARD_WEIGHTS`."""
    return max(1, min(workers, total // MIN_SHARD_WEIGHTS))


def split_shards(sizes: list[int], k: int) -> list[tuple[int, int]]:
    """Split a flat buffer of parameters with ``sizes`` into ``k`` contiguous ranges balanced by size.

    Ranges cut at element boundaries (a parameter may straddle two shards), so the shards differ by
    at most one element. Raises ValueError when ``k`` exceeds the number of elements.
    """
    total = int(sum(sizes))
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"numShards must be an int >= 1, found {k!r}")
    if k > total:
        raise ValueError(f"numShards={k} is more than the model's {total} parameters; use at most {total}")
    bounds = [round(i * total / k) for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


__all__ = ["MIN_SHARD_WEIGHTS", "SERVER_OPTIMIZERS", "decayed", "default_shards", "delay_compensate", "rule_names",
           "server_rule", "split_shards", "sgd", "momentum", "adagrad", "rmsprop"]
