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

__all__ = ["finetune_network", "finetune_suffix", "freeze_until", "frozen_suffix", "head_architecture", "head_name"]


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


class _CutTracer(torch.fx.Tracer):
    """A tracer that keeps ``layer`` as one call (a leaf), so its output is one node to cut at."""

    def __init__(self, layer: str) -> None:
        super().__init__()
        self.layer = layer

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname == self.layer or super().is_leaf_module(m, qualname)


def frozen_suffix(net: nn.Module, layer: str) -> tuple[nn.Module | None, str]:
    """The part of ``net`` after ``layer``, as a module whose input is ``layer``'s output, when ``net`` is
    frozen up to ``layer`` (:func:`freeze_until`) and cuts there: ``(suffix, "")``, or ``(None, why not)``.

    The suffix shares ``net``'s sub-modules and keeps their names, so its ``state_dict`` keys are ``net``'s
    keys for the layers after the cut. It cuts where everything computed after ``layer`` depends on no value
    computed before it other than ``layer``'s output (a skip connection across the cut would), and where
    everything before it is frozen and deterministic: no trainable parameter, no BatchNorm in training mode,
    no dropout. The frozen part is then a fixed function of the image, which can be computed once per image
    (:class:`irbis.ml.ImageClassifier`'s ``cacheFrozen``)."""
    try:
        graph = _CutTracer(layer).trace(net)
    except Exception as err:  # noqa: BLE001 - data-dependent control flow and the like
        return None, f"{type(net).__name__} cannot be traced by torch.fx ({type(err).__name__}: {err})"
    nodes = list(graph.nodes)
    cut = next((n for n in nodes if n.op == "call_module" and n.target == layer), None)
    if cut is None:
        return None, f"{layer!r} is not called by {type(net).__name__}.forward"
    before = set(nodes[:nodes.index(cut)])
    modules = dict(net.named_modules())
    for n in before:
        owner = modules.get(n.target) if n.op == "call_module" else None
        if owner is not None and (any(p.requires_grad for p in owner.parameters())
                                  or (owner.training and isinstance(owner, (nn.modules.batchnorm._BatchNorm,
                                                                             nn.Dropout)))):
            return None, f"{n.target!r}, before {layer!r}, trains or draws at random"
        if n.op == "get_attr" and isinstance(getattr_path(net, n.target), nn.Parameter) \
                and getattr_path(net, n.target).requires_grad:
            return None, f"{n.target!r}, before {layer!r}, trains"
    if any(p.requires_grad for p in modules[layer].parameters()):
        return None, f"{layer!r} itself trains"
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {cut: new.placeholder("x")}
    for n in nodes[nodes.index(cut) + 1:]:
        for arg in n.all_input_nodes:
            if arg in before and arg.op != "get_attr":
                return None, f"{n.name!r}, after {layer!r}, reads {arg.name!r} from before it (a skip connection)"
            if arg not in env:  # a weight read before the cut in the node order
                env[arg] = new.node_copy(arg)
        env[n] = new.node_copy(n, lambda a: env[a])
    suffix = torch.fx.GraphModule(net, new, class_name=f"{type(net).__name__}After")
    suffix.train(net.training)
    return suffix, ""


def getattr_path(module: nn.Module, target: str) -> Any:
    """``module``'s attribute at the dotted ``target`` (an fx ``get_attr`` node's)."""
    obj: Any = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def finetune_suffix(backbone: str, num_classes: int, freeze: str, seed: int = 0, pretrained: bool = True,
                    dropout: float | None = None) -> nn.Module:
    """:func:`finetune_network` after ``freeze``: the layers that train, taking ``freeze``'s output as input
    (the module factory of ImageClassifier's cached-frozen path). Raises ``ValueError`` saying why when the
    network does not cut at ``freeze``.

    Its weights are laid out channels-last, as the training loop lays out a whole network that takes images:
    a convolution runs channels-last when its weight is, so the frozen layers' output (a tensor column, laid
    out NCHW) needs no other change, and a training step of EfficientNet-Lite0's last blocks runs faster
    than in NCHW."""
    suffix, why = frozen_suffix(finetune_network(backbone, num_classes, freeze, seed, pretrained, dropout), freeze)
    if suffix is None:
        raise ValueError(f"{backbone} does not cut at freezeUntil {freeze!r}: {why}")
    return suffix.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs lack it
