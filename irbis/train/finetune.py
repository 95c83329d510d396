"""The network of a fine-tuning job: a catalogue backbone with its pretrained weights and a new head.

:func:`finetune_network` is the module factory that :class:`irbis.ml.ImageClassifier` hands to the training
loop: every worker builds the same network from it (the head is drawn from ``seed``). Its state dict has
the keys of the catalogue architecture built with ``num_classes`` classes, so the fitted weights load into
that architecture (:func:`head_architecture`) for inference.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["finetune_network", "freeze_until", "head_architecture", "head_name"]


def head_name(module: nn.Module) -> str:
    """The name of the network's classifier: its last ``nn.Linear``."""
    names = [name for name, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError(f"{type(module).__name__} has no nn.Linear classifier to replace")
    return names[-1]


def head_architecture(backbone: str, num_classes: int) -> dict[str, Any]:
    """``{"architecture", "options"}`` of the backbone's architecture with a ``num_classes`` head."""
    from irbis.models import get_entry

    entry = get_entry(backbone)
    return {"architecture": entry.architecture, "options": {**entry.options, "num_classes": int(num_classes)}}


def freeze_until(module: nn.Module, layer: str) -> int:
    """Freeze every parameter up to and including those of ``layer`` (a ``named_modules()`` name), in the
    network's order; its BatchNorm layers stay in eval mode (their statistics frozen too). Returns how
    many parameters were frozen. Raises ``ValueError`` naming ``layer`` and some valid names when it is
    not a module of the network."""
    modules = dict(module.named_modules())
    if layer not in modules or not layer:
        names = [n for n in modules if n and "." not in n]
        raise ValueError(f"freezeUntil {layer!r} names no layer of {type(module).__name__}; its top-level "
                         f"layers: {names}")
    params = list(module.named_parameters())
    last = max((i for i, (n, _) in enumerate(params) if n == layer or n.startswith(layer + ".")), default=-1)
    if last < 0:
        raise ValueError(f"freezeUntil {layer!r} has no parameters; name a layer with weights")
    frozen = {n for n, _ in params[:last + 1]}
    for name, p in params[:last + 1]:
        p.requires_grad_(False)
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and all(
                f"{name}.{k}" in frozen for k, _ in m.named_parameters(recurse=False)):
            m.train = _stay_in_eval.__get__(m)  # type: ignore[method-assign]
            m.eval()
    return len(frozen)


def _stay_in_eval(self: nn.Module, mode: bool = True) -> nn.Module:
    return nn.Module.train(self, False)


def finetune_network(backbone: str, num_classes: int, freeze: str = "", seed: int = 0,
                     pretrained: bool = True, dropout: float | None = None) -> nn.Module:
    """The catalogue model ``backbone`` with its pretrained weights (where the catalogue ships them), its
    classifier replaced by a new ``num_classes`` one drawn from ``seed``, frozen up to ``freeze`` (empty:
    every layer trains)."""
    from irbis.models import ModelRepository, get_entry

    entry = get_entry(backbone)
    net = ModelRepository().load_model(backbone, pretrained=pretrained and entry.uri is not None)
    name = head_name(net)
    parent, _, attr = name.rpartition(".")
    owner = net.get_submodule(parent) if parent else net
    old = getattr(owner, attr)
    generator = torch.Generator().manual_seed(int(seed))
    head = nn.Linear(old.in_features, int(num_classes))
    with torch.no_grad():
        bound = 1.0 / old.in_features ** 0.5
        head.weight.uniform_(-bound, bound, generator=generator)
        head.bias.uniform_(-bound, bound, generator=generator)
    setattr(owner, attr, head)
    if dropout is not None and isinstance(getattr(net, "_dropout", None), nn.Dropout):
        net._dropout.p = float(dropout)
    if freeze:
        freeze_until(net, freeze)
    return net
