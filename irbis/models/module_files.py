"""An in-memory network as files that load without unpickling code: ``torch.export`` archives first.

:func:`write_module` tries, in order:

1. a ``torch.export`` archive (``network.pt2``) traced on zeros of the input shape, with a dynamic
   batch axis. It loads as a module tree with the original module names, so any inner layer can be
   read (``outputLayer``) and the network exported to ONNX for the other engines;
2. when ``torch.export`` cannot capture the network (data-dependent control flow, unsupported
   Python), a clear log line, then the state dict (``weights.pt``, tensors only) plus a class reference in
   ``architecture.json`` (``{"class": "package.module:Class", "options": {constructor kwargs}}``),
   rebuilt by importing the class and run eagerly. The class must be importable by name in the
   workers (not defined in ``__main__`` or inside a function);
3. else TorchScript (``network.pt``), which runs the whole network but cannot be cut at an inner
   layer (with no input shape known, TorchScript is tried before the class reference).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from irbis.refs import reference, resolve

_LOG = logging.getLogger("irbis.models")


def write_module(module: nn.Module, folder: Path, input_shape: list[int] | None,
                 options: dict[str, Any] | None = None, eager: bool = False) -> Path:
    """Write ``module`` into ``folder`` as described in the module docstring; return the main file.

    Without an input shape (none given, none fixed by a first Linear layer) TorchScript comes before
    the class reference, as the class may not be importable in the Spark workers. With ``eager`` (a
    network of variable-length inputs, called with padded ids and a mask or a PackedSequence) the class
    reference comes first, then TorchScript, and no trace is tried.
    """
    module = module.eval()
    if eager:
        reasons = ["it takes variable-length inputs"]
        for writer in (_write_reference, _write_torchscript):
            try:
                return writer(module, folder, options or {}, reasons[0])
            except (TypeError, RuntimeError) as err:
                reasons.append(str(err))
        raise TypeError(f"cannot store {type(module).__name__}: {'; '.join(reasons)}. Define the class in an "
                        f"importable module (with its constructor kwargs as options=)")
    shape = input_shape or _first_linear_shape(module)
    reasons = []
    if shape:
        try:
            return _write_pt2(module, shape, folder / "network.pt2")
        except Exception as err:  # noqa: BLE001 - torch.export fails in many ways; report the reason
            reasons.append(f"torch.export cannot capture it: {_first_line(err)}")
    else:
        reasons.append("no inputShape was given to trace it on")
    writers = [_write_reference, _write_torchscript] if shape else [_write_torchscript, _write_reference]
    for writer in writers:
        try:
            return writer(module, folder, options or {}, reasons[0])
        except (TypeError, RuntimeError) as err:
            reasons.append(str(err))
    raise TypeError(
        f"cannot store {type(module).__name__}: {'; '.join(reasons)}. Pass inputShape so torch.export can "
        f"trace it, define the class in an importable module (with its constructor kwargs as options=), "
        f"or pass architecture= with an irbis.models.ARCHITECTURES name")


def _write_reference(module: nn.Module, folder: Path, options: dict[str, Any], reason: str) -> Path:
    reference = class_reference(module)
    if reference is None:
        raise TypeError(f"its class {type(module).__qualname__} cannot be imported by name")
    build_from_reference(reference, options).load_state_dict(module.state_dict())
    (folder / "architecture.json").write_text(json.dumps({"class": reference, "options": options}))
    torch.save(module.state_dict(), folder / "weights.pt")
    _LOG.warning("%s is stored as its state dict and class %s and runs eagerly (%s)",
                 type(module).__name__, reference, reason)
    return folder


def _write_torchscript(module: nn.Module, folder: Path, options: dict[str, Any], reason: str) -> Path:
    dest = folder / "network.pt"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(module), str(dest))
    except Exception as err:  # noqa: BLE001 - scripting fails in many ways
        raise TypeError(f"TorchScript cannot compile it ({_first_line(err)})") from err
    _LOG.info("%s is stored as TorchScript (%s): it runs whole but cannot be cut at an inner layer; pass "
              "inputShape to store it as a torch.export archive", type(module).__name__, reason)
    return dest


def _first_line(err: BaseException) -> str:
    return (str(err).strip() or type(err).__name__).splitlines()[0][:300]


def _write_pt2(module: nn.Module, shape: list[int], dest: Path) -> Path:
    example = torch.zeros(2, *shape)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(module, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    with warnings.catch_warnings():
        # Weights that are views of one storage, none of them the whole (as ImageClassifier's fine-tuned
        # networks have): the archive keeps the storage whole and they load back equal. The warning is about
        # weights off the CPU, and these were traced on a CPU example.
        warnings.filterwarnings("ignore", message="No complete tensor found in the group")
        torch.export.save(program, str(dest))
    return dest


def _first_linear_shape(module: nn.Module) -> list[int] | None:
    """The input shape of a network that starts with a Linear layer, which fixes it."""
    first = module[0] if isinstance(module, nn.Sequential) and len(module) else module
    return [first.in_features] if isinstance(first, nn.Linear) else None


def class_reference(module: nn.Module) -> str | None:
    """``package.module:Class`` when the module's class can be imported back by that name, else None."""
    try:
        return reference(type(module))
    except ValueError:
        return None


def build_from_reference(ref: str, options: dict[str, Any]) -> nn.Module:
    """Build the network class named ``package.module:Class`` with ``options``; only nn.Module classes."""
    cls = resolve(ref)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"{ref} is not a torch.nn.Module class; a model folder's class must be one")
    return cls(**options)


def load_exported(path: Path) -> nn.Module:
    """A ``torch.export`` archive as a module tree with the original names (hooks on any layer work)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.unflatten(torch.export.load(str(path)))
