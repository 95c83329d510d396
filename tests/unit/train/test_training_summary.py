"""The training summary in a notebook: a table of one row per epoch and a loss-curve plot, while it stays the
plain list of dicts that the CLI prints, ``summary.json`` stores and the tests compare."""

import html
import json
import re

import numpy as np
import pytest
from matplotlib.figure import Figure

from irbis.train.progress import TrainingSummary, plot_loss_curves

RECORDS = [
    {"epoch": 1, "loss": 0.912345, "validationLoss": 0.95, "accuracy": 0.5, "samplesPerSecond": 1234.5,
     "staleness": {"updates": 10, "mean": 1.5, "max": 3, "histogram": [2, 3, 4, 1]}, "batchTrials": [0.1, 0.2]},
    {"epoch": 2, "loss": 0.4, "validationLoss": 0.6, "accuracy": 0.75, "samplesPerSecond": 1500.0,
     "staleness": {"updates": 12, "mean": 0.5, "max": 1, "histogram": [6, 6, 0, 0]},
     "warning": "the loss grew from <1> & more"},
    {"epoch": 3, "loss": 0.25, "validationLoss": None, "accuracy": None, "samplesPerSecond": 1600.0,
     "staleness": {"updates": 0}},
]


def _table(markup: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and the body rows' cells of the summary's HTML table (unescaped)."""
    head = re.findall(r"<th>(.*?)</th>", markup)
    body = markup.split("<tbody>", 1)[1]
    rows = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]
    return head, rows


def test_the_summary_is_still_the_plain_list_of_dicts():
    summary = TrainingSummary(RECORDS)
    assert isinstance(summary, list) and summary == RECORDS and RECORDS == summary
    assert json.dumps(summary) == json.dumps(RECORDS)
    assert json.loads(json.dumps(summary)) == RECORDS
    assert [r["epoch"] for r in summary] == [1, 2, 3] and summary[-1]["loss"] == 0.25


def test_the_html_table_has_one_row_per_epoch_with_its_values():
    summary = TrainingSummary(RECORDS)
    head, rows = _table(summary._repr_html_())
    assert head == ["epoch", "loss", "validationLoss", "accuracy", "samplesPerSecond", "staleness.updates",
                    "staleness.mean", "staleness.max", "warning"]  # nested dotted, lists left out
    assert len(rows) == 3 and all(len(row) == len(head) for row in rows)
    assert [row[0] for row in rows] == ["1", "2", "3"]
    assert [row[head.index("loss")] for row in rows] == ["0.9123", "0.4", "0.25"]
    assert [row[head.index("staleness.mean")] for row in rows] == ["1.5", "0.5", ""]
    assert [row[head.index("samplesPerSecond")] for row in rows] == ["1,234", "1,500", "1,600"]
    assert rows[2][head.index("validationLoss")] == ""  # None shows as an empty cell
    assert rows[1][head.index("warning")] == "the loss grew from <1> & more"
    assert "<1>" not in summary._repr_html_()  # text is escaped
    assert "training summary: 3 epochs" in summary._repr_html_()


def test_an_empty_summary_renders_an_empty_table():
    head, rows = _table(TrainingSummary()._repr_html_())
    assert head == [] and rows == []


def test_plot_draws_the_training_and_validation_loss_per_epoch_on_a_log_axis():
    ax = Figure().add_subplot()
    assert TrainingSummary(RECORDS).plot(ax=ax) is ax
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["training", "validation"]
    assert list(lines["training"].get_xdata()) == [1, 2, 3]
    assert np.allclose(lines["training"].get_ydata(), [0.912345, 0.4, 0.25])
    assert list(lines["validation"].get_xdata()) == [1, 2]  # epoch 3 had no validation loss
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "loss"


def test_plot_reads_a_nested_value_on_a_linear_axis():
    ax = Figure().add_subplot()
    TrainingSummary(RECORDS).plot("staleness.mean", ax=ax)
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [1, 2] and np.allclose(line.get_ydata(), [1.5, 0.5])
    assert ax.get_yscale() == "linear" and ax.get_title() == "staleness.mean per epoch"


def test_plot_loss_curves_still_saves_a_png(tmp_path):
    out = plot_loss_curves({"a": RECORDS, "b": RECORDS[:2]}, str(tmp_path / "loss.png"))
    assert out == str(tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("stage", ["TorchModel", "ImageClassifierModel"])
def test_a_fitted_models_summary_is_kept_as_a_training_summary(stage):
    import irbis.ml as ml

    model = getattr(ml, stage)()
    assert model.training_summary is None
    model.training_summary = json.loads(json.dumps(RECORDS))  # as read back from summary.json
    assert type(model.training_summary) is TrainingSummary and model.training_summary == RECORDS
    assert "<tbody><tr><td>1</td>" in model.training_summary._repr_html_()
    assert model.copy().training_summary == RECORDS
    model.training_summary = None
    assert model.training_summary is None
