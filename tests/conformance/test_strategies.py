"""Conformance suite: every entry of STRATEGIES is enrolled automatically."""

import io
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "train"))
from irbis.train.backends.local import run_threads, shard_rows  # noqa: E402
from irbis.train.loop import TrainSpec  # noqa: E402
from irbis.train.networks import network_spec  # noqa: E402
from irbis.train.strategies import STRATEGIES, make_strategy  # noqa: E402
from irbis.train.strategy import Strategy  # noqa: E402
from train_helpers import run_workers, tiny_net, token_task, weights  # noqa: E402

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


#: Per-strategy options of the recurrent case: 1-bit SGD quantises the small LSTM's gradient in columns of 8
#: values (its default columns, as tall as a weight matrix's, lose too much of a 16-unit layer's signal).
LSTM_OPTIONS = {"one_bit": {"columnSize": 8}}


@pytest.mark.parametrize("name", NAMES)
def test_an_lstm_over_variable_length_rows_learns_under_every_strategy(name):
    # does token 7 occur in a row of 3-40 tokens: an LSTM over packed rows, two workers, length batches
    x, y = token_task(320)
    spec = TrainSpec.of(network=network_spec("lstm_classifier", {"vocab_size": 20, "embed": 8, "hidden": 16}),
                        epochs=6, batchSize=16, learningRate=1e-2, strategy=name,
                        strategyOptions=LSTM_OPTIONS.get(name, {}), validationFraction=0.25, tokenBudget=1024,
                        torch_threads=1)
    res = run_threads(spec, shard_rows(x, y, 2))
    last = res[0].history[-1]
    assert last["accuracy"] > 0.75, res[0].history  # chance is 0.5
    assert 1.0 <= last["paddingWaste"] < 1.6
