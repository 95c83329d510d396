"""Callable references: one format (``package.module:qualname``), resolved by pkgutil.resolve_name."""

from __future__ import annotations

import pytest
from torch import nn

from irbis.models.module_files import build_from_reference, class_reference
from irbis.models.small import mlp
from irbis.refs import is_reference, is_unsaved, reference, resolve, unsaved


class _Net(nn.Module):
    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 2)


def test_a_top_level_function_or_class_round_trips():
    assert reference(mlp) == "irbis.models.small:mlp" and resolve("irbis.models.small:mlp") is mlp
    assert reference(_Net) == f"{__name__}:_Net" and resolve(reference(_Net)) is _Net
    assert class_reference(_Net(4)) == f"{__name__}:_Net"
    assert build_from_reference(f"{__name__}:_Net", {"width": 4}).fc.in_features == 4


def test_what_has_no_reference_says_why():
    def closure():
        return None

    for obj, reason in [(lambda: None, "lambda"), (closure, "closure"), (3, "no __module__")]:
        with pytest.raises(ValueError, match=reason):
            reference(obj)
    assert class_reference(nn.Sequential(nn.Linear(2, 2))) == "torch.nn.modules.container:Sequential"
    placeholder = unsaved("'f' is a lambda")
    assert is_unsaved(placeholder) and not is_reference(placeholder) and "'f' is a lambda" in placeholder


def test_references_are_told_apart_from_names_and_paths():
    for value in ("irbis.models.small:mlp", "pkg.mod:Outer.inner"):
        assert is_reference(value), value
    for value in ("mlp", "cross_entropy", "/models/net.pt", "hdfs://host/net.pt", "file:/tmp/x.pt", "a:b:c", 3):
        assert not is_reference(value), value
    with pytest.raises(ValueError, match="package.module:qualname"):
        resolve("mlp")
    with pytest.raises(ImportError):
        resolve("irbis.no_such_module:f")
    with pytest.raises(AttributeError):
        resolve("irbis.models.small:no_such_function")
