"""Safe loading of weight files: torch zip (.pt/.pth), legacy torch files and safetensors.

Pickles can run arbitrary code, so ``torch.load`` runs with ``weights_only=True`` unless the caller opts
in with ``allow_pickle=True``. Zip-format torch files are memory-mapped (``mmap=True``): the tensors'
pages come from the page cache and are shared by every process that maps the same file. torch is
imported when a file is loaded, so the checksum helpers serve processes that never load torch.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_SAFETENSORS_SUFFIXES = (".safetensors", ".st")


class UnsafeModelFileError(ValueError):
    """A weight file needs full unpickling, which the caller has not allowed."""


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex sha256 digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def is_mmappable(path: str | os.PathLike[str]) -> bool:
    """True for files that load memory-mapped: torch zip archives and safetensors."""
    return Path(path).suffix in _SAFETENSORS_SUFFIXES or zipfile.is_zipfile(path)


def safe_load_state_dict(path: str | os.PathLike[str], allow_pickle: bool = False,
                         mmap: bool = True) -> dict[str, torch.Tensor]:
    """Load a state dict from a .pt/.pth (torch zip or legacy) or .safetensors file, on CPU.

    Parameters
    ----------
    path : str or os.PathLike
        The weight file.
    allow_pickle : bool
        Allow full unpickling (``weights_only=False``). Only for files from a source you trust.
    mmap : bool
        Memory-map zip-format torch files (safetensors files are always mapped).

    Returns
    -------
    dict of str to torch.Tensor
        The state dict (a pickled ``nn.Module`` or a ``{"state_dict": ...}`` checkpoint is unwrapped).

    Raises
    ------
    FileNotFoundError
        The file does not exist (the message names the path).
    UnsafeModelFileError
        The file holds objects that ``weights_only`` refuses and ``allow_pickle`` is False.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weight file not found: {path}")
    if path.suffix in _SAFETENSORS_SUFFIXES:
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")
    use_mmap = mmap and zipfile.is_zipfile(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=not allow_pickle, mmap=use_mmap)
    except pickle.UnpicklingError as e:
        if allow_pickle:
            raise
        raise UnsafeModelFileError(
            f"{path} holds pickled objects that weights_only loading refuses; if you trust its source, "
            f"pass allow_pickle=True (or re-save it with torch.save(model.state_dict(), path)). "
            f"Detail: {str(e).splitlines()[0]}") from e
    return _as_state_dict(obj, path)


def _as_state_dict(obj: object, path: Path) -> dict[str, torch.Tensor]:
    import torch

    if isinstance(obj, torch.nn.Module):
        return dict(obj.state_dict())
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if isinstance(obj, Mapping) and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj)
    raise TypeError(f"{path} does not hold a state dict (a mapping of names to tensors), found "
                    f"{type(obj).__name__}; save one with torch.save(model.state_dict(), path)")
