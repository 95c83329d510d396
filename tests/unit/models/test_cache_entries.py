"""Content-addressed cache entries written by several processes at once (two test runs, two Spark
workers): the first whole entry stays, and a later writer of the same content neither fails nor leaves
its staging folder behind."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from irbis.ml import TorchModel
from irbis.models.fetch import place_folder


def _staging(parent, text: str):
    folder = parent / f".staging-{text}"
    folder.mkdir()
    (folder / "weights.pt").write_text(text)
    return folder


def test_a_folder_placed_onto_a_free_entry_moves_there_whole(tmp_path):
    dest = place_folder(_staging(tmp_path, "a"), tmp_path / "entry")
    assert (dest / "weights.pt").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_a_second_writer_of_a_taken_entry_keeps_the_first_and_removes_its_staging(tmp_path):
    place_folder(_staging(tmp_path, "first"), tmp_path / "entry")
    dest = place_folder(_staging(tmp_path, "second"), tmp_path / "entry")
    assert (dest / "weights.pt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_a_failed_move_for_another_reason_is_raised_and_cleans_up(tmp_path):
    staging = _staging(tmp_path, "a")
    with pytest.raises(OSError):
        place_folder(staging, tmp_path / "missing-parent" / "entry")
    assert not staging.exists()


def test_a_network_wrapped_twice_shares_one_entry_and_leaves_no_staging(tmp_path, monkeypatch):
    """The second wrap finds its entry taken (as a concurrent writer would) and keeps the first."""
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 2))
    paths = {TorchModel.from_module(net, inputShape=[3, 2, 2], inputCol="x").getNetwork() for _ in range(2)}
    assert len(paths) == 1
    modules = tmp_path / "models" / "modules"
    assert [p.name for p in modules.iterdir()] == [Path(paths.pop()).parent.name]
