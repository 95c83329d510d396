"""Networks stored as files (irbis.models.module_files): torch.export archives."""
from __future__ import annotations

import warnings

import torch
from torch import nn

from irbis.models.module_files import load_exported, write_module


def test_weights_viewing_one_storage_store_without_a_warning_and_load_back_equal(tmp_path):
    """Weights that are views of one storage, none of them the whole, made torch.export.save warn (a notebook
    showed it under every fine-tuning); the archive holds them right."""
    base = torch.randn(10, 4)
    layer = nn.Linear(4, 3)
    layer.weight = nn.Parameter(base[2:5])
    layer.bias = nn.Parameter(base[7, :3])
    network = nn.Sequential(layer).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = write_module(network, tmp_path, [4], {})
    assert path.name == "network.pt2"
    assert not [str(w.message) for w in caught if "complete tensor" in str(w.message)]
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(load_exported(path)(x), network(x))
