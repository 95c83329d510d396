"""The command line's help tells the truth: every registry entry is offered, in plain text."""

from __future__ import annotations

import argparse

import pytest

from irbis.cli import build_parser, main, plain_text
from irbis.demo.data import SIZES
from irbis.kernels.engines import ENGINE_NAMES
from irbis.kernels.inference import PRECISIONS
from irbis.models import MODELS, register_model, unregister_model
from irbis.models.architectures import ARCHITECTURES
from irbis.train.optim import OPTIMIZERS
from irbis.train.strategies import STRATEGIES, Downpour, SyncSGD

COMMANDS = ["demo", "featurize", "embed", "score", "train", "pack", "photos", "classify", "explain", "serve", "models"]


def help_of(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # names stay on one line


def test_the_commands_are_the_ones_the_top_help_names(capsys):
    text = help_of(capsys)
    for command in COMMANDS:
        assert command in text
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(COMMANDS)
    import irbis.cli

    listed = irbis.cli.__doc__.split("``irbis ", 1)[1].split("``", 1)[0].replace("\n", " ")
    assert [c.strip() for c in listed.split("|")] == COMMANDS  # the description's list, in the help's order


@pytest.mark.parametrize("command", [[]] + [[c] for c in COMMANDS])
def test_help_has_no_restructuredtext_markup(capsys, command):
    text = help_of(capsys, *command)
    assert "`" not in text, text
    assert not any(role in text for role in (":func:", ":class:", ":data:", ":mod:", ":meth:"))


def test_train_help_lists_every_strategy_as_synchronous_or_parameter_server(capsys):
    text = " ".join(help_of(capsys, "train").split())
    sync_part, server_part = text.split("(synchronous)")[0], text.split("(synchronous)")[1]
    for name, cls in STRATEGIES.items():
        assert name in (server_part.split("(parameter server)")[0] if cls.owns_update else sync_part), name
    assert "downpour" in server_part and "dcasgd" in server_part


def test_a_strategy_added_to_the_registry_is_offered_and_accepted(capsys, monkeypatch):
    class Async2(Downpour):
        name = "async_test_only"

    class Sync2(SyncSGD):
        name = "sync_test_only"

    monkeypatch.setitem(STRATEGIES, Async2.name, Async2)
    monkeypatch.setitem(STRATEGIES, Sync2.name, Sync2)
    text = " ".join(help_of(capsys, "train").split())
    assert "sync_test_only" in text.split("(synchronous)")[0]
    assert "async_test_only" in text.split("(synchronous)")[1]
    args = build_parser().parse_args(["train", "data", "--task", "vectors", "--strategy", "async_test_only"])
    assert args.strategy == "async_test_only"


def test_an_unknown_strategy_is_refused_naming_the_registry(capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "data", "--task", "vectors", "--strategy", "hogwild"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'hogwild'" in err and all(name in err for name in STRATEGIES)


def test_engines_precisions_sizes_architectures_and_optimizers_come_from_their_registries(capsys):
    models = help_of(capsys, "models")
    assert all(e in models for e in ENGINE_NAMES) and all(name in models for name in MODELS)
    for command in ("featurize", "classify", "photos", "demo", "models"):
        assert f"{{{','.join(PRECISIONS)}}}" in help_of(capsys, command), command
    assert f"{{{','.join(SIZES)}}}" in help_of(capsys, "demo")
    train = help_of(capsys, "train")
    assert all(a in train for a in ARCHITECTURES) and all(o in train for o in OPTIMIZERS)


def test_a_registered_image_model_is_offered_where_a_catalogue_model_is_asked_for(capsys):
    card = {"name": "cli_test_cnn", "architecture": "small_cnn", "input_shape": [3, 32, 32], "num_classes": 10,
            "preprocessing": {"input_size": [32, 32], "mean": [0, 0, 0], "std": [1, 1, 1]}}
    register_model(card)
    try:
        for command in (["featurize"], ["train"], ["models"]):
            assert "cli_test_cnn" in help_of(capsys, *command), command
        assert "cli_test_cnn" not in help_of(capsys, "classify")  # 10 classes, not ImageNet's 1000
        assert build_parser().parse_args(["featurize", "in", "--network", "cli_test_cnn"]).network == "cli_test_cnn"
    finally:
        unregister_model("cli_test_cnn")
    assert "cli_test_cnn" not in help_of(capsys, "featurize")


def flags(command):
    """The flags ``command`` shows in its help, each with its action."""
    parser = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return {o: a for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings}


def test_one_flag_name_per_concept_on_every_command(capsys):
    """--master, --output, --precision, --network and --workers mean one thing wherever they appear."""
    from irbis.spark.session import DEFAULT_MASTER

    shown = {c: flags(c) for c in COMMANDS}
    for command in ("demo", "featurize", "train", "photos", "classify", "explain"):
        assert shown[command]["--master"].default == DEFAULT_MASTER == "local[*]", command
    assert "--master" in shown["serve"] and "--spark" not in shown["serve"]
    for command in ("demo", "featurize", "train", "pack", "photos", "explain"):
        assert "--output" in shown[command], command
    assert all(a.default == "fp32" for c in COMMANDS for o, a in shown[c].items() if o == "--precision")
    assert [c for c in COMMANDS if "--workers" in shown[c]] == ["train"]  # training tasks
    assert "--processes" in shown["serve"]
    assert "--network" in shown["featurize"] and "--network" in shown["classify"]
    assert not any("--model" in shown[c] for c in COMMANDS)
    for command in COMMANDS:  # every default is said
        options = " ".join(help_of(capsys, command).split()).split("options:")[1] + " "
        listed = [a for a in dict.fromkeys(shown[command].values()) if a.dest != "help"]  # in the help's order
        for action, following in zip(listed, listed[1:] + [None]):
            entry = options.split(f" {action.option_strings[0]} ", 1)[1]
            entry = entry.split(f" {following.option_strings[0]} ", 1)[0] if following else entry
            if action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in entry, (command, action.option_strings, entry)


@pytest.mark.parametrize("argv, flag", [
    (["serve", "model", "--spark", "local[2]"], "--spark"),
    (["serve", "model", "--workers", "3"], "--workers"),
    (["featurize", "in", "--model", "resnet18"], "--model"),
    (["classify", "in", "--model", "resnet18"], "--model"),
])
def test_the_removed_flag_names_are_refused(capsys, argv, flag):
    """0.1.0 is the first release: serve's --spark and --workers and the --model of featurize and classify are
    gone (--master, --processes, --network), refused as any unknown flag is."""
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(argv)
    assert done.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_train_names_its_task_and_keeps_the_stages_defaults(capsys):
    from irbis.cli.train import TRAIN_PARAMS, train_params
    from irbis.ml import ImageClassifier, TorchEstimator

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "folder"])  # which stage trains is said, not guessed
    assert "--task" in capsys.readouterr().err
    args = build_parser().parse_args(["train", "folder", "--task", "image"])
    assert train_params(args) == {}  # nothing set: ImageClassifier's own defaults
    args = build_parser().parse_args(["train", "data", "--task", "vectors", "--epochs", "7", "--workers", "3",
                                      "--training-precision", "bf16"])
    assert train_params(args) == {"epochs": 7, "numWorkers": 3, "trainingPrecision": "bf16"}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "data", "--task", "vectors", "--training-precision", "fp16"])
    text = " ".join(help_of(capsys, "train").split())
    for stage in (ImageClassifier, TorchEstimator):
        assert all(stage().hasParam(p) for p in TRAIN_PARAMS.values())
    clf, est = ImageClassifier(), TorchEstimator()
    assert (f"ImageClassifier's {clf.getEpochs()} (--task image), TorchEstimator's {est.getEpochs()} "
            f"(--task vectors)") in text
    assert (f"ImageClassifier's {clf.getBatchSize()} (--task image), TorchEstimator's {est.getBatchSize()} "
            f"(--task vectors)") in text


@pytest.mark.parametrize("text, plain", [
    ("The ``irbis`` command line", "The irbis command line"),
    (":func:`~irbis.spark.session.get_spark` and :data:`irbis.train.strategies.STRATEGIES`",
     "get_spark and irbis.train.strategies.STRATEGIES"),
    (":class:`the estimator <irbis.ml.estimator.TorchEstimator>`", "the estimator"),
    ("a `default role` here", "a default role here"),
    ("95%% of it, no markup", "95%% of it, no markup"),
])
def test_plain_text_takes_the_markup_out(text, plain):
    assert plain_text(text) == plain


def test_the_top_help_and_parsing_another_command_import_no_torch_and_no_pyspark():
    """The registries that need torch are read only where their names are shown or checked, and the Spark
    session's module only where a command runs."""
    import subprocess
    import sys

    code = ("import sys; from irbis.cli import build_parser; p = build_parser(); p.format_help(); "
            "p.parse_args(['demo', '--size', 'small', '--precision', 'bf16']); "
            "print('torch' in sys.modules, 'pyspark' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "False False", run.stdout + run.stderr
