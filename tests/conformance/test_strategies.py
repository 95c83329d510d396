"""Conformance suite: every entry of STRATEGIES is enrolled automatically."""

import io
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "train"))
from train_helpers import run_workers, tiny_net, weights  # noqa: E402

from irbis.train.strategies import STRATEGIES, make_strategy  # noqa: E402
from irbis.train.strategy import Strategy  # noqa: E402

NAMES = sorted(STRATEGIES)


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_is_a_strategy_named_by_its_key(name):
    cls = STRATEGIES[name]
    assert issubclass(cls, Strategy) and cls.name == name
    assert cls.__doc__ and sys.modules[cls.__module__].__doc__  # paper and math live in the module docstring


@pytest.mark.parametrize("name", NAMES)
def test_options_are_json_and_rebuild_the_same_strategy(name):
    s = make_strategy(name)
    opts = json.loads(json.dumps(s.options()))
    assert make_strategy(name, **opts).options() == s.options()
    assert repr(s).startswith(type(s).__name__)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_and_bad_values_fail_eagerly(name):
    with pytest.raises(ValueError, match=name):
        make_strategy(name, noSuchOption=1)
    for key in make_strategy(name).options():
        with pytest.raises((ValueError, TypeError)):
            make_strategy(name, **{key: -3})


@pytest.mark.parametrize("name", NAMES)
def test_two_workers_end_with_identical_replicas_that_learned(name):
    out = run_workers(2, lambda: make_strategy(name), steps=7)
    w0, w1 = (weights(m) for m, _ in out)
    assert torch.allclose(w0, w1, atol=1e-6)
    assert not torch.allclose(w0, weights(tiny_net(0)))


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trips_through_safe_torch_load(name):
    (model, dopt), _ = run_workers(2, lambda: make_strategy(name), steps=5)
    buf = io.BytesIO()
    torch.save(dopt.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    fresh = make_strategy(name)
    fresh.load_state_dict(state["strategy"])
    a, b = dopt.strategy.state_dict(), fresh.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
