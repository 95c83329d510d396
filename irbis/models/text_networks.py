"""Text networks: the catalogue's sentence encoder and a user's Hugging Face-format folder, loaded safely.

A text network is a folder in the Hugging Face layout: ``config.json`` (the architecture), safetensors
weights (``model.safetensors``) and ``tokenizer.json`` (a ``tokenizers`` tokenizer). Nothing is downloaded
and nothing is unpickled: the architecture is built from its config by ``transformers`` and the weights
are read from safetensors. Its card (:class:`TextCard`) says what the network gives (``embedding`` or
``classification``), its maximum length, its pooling and its labels.

The catalogue (``text_catalogue.json``) names folders that ship inside registry packages, with each file's
sha256, verified before the first load in a process. ``all_minilm_l6_v2`` is the default sentence encoder.

Examples
--------
>>> card = text_card("all_minilm_l6_v2")
>>> card.task, card.max_length, card.pooling, card.dim
('embedding', 256, 'mean', 384)
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_TEXT_MODEL", "TEXT_MODELS", "TextCard", "TextModelError", "load_text_module",
           "text_card", "text_folder", "text_source"]

#: The catalogue's sentence encoder, which text stages use when no network is named.
DEFAULT_TEXT_MODEL = "all_minilm_l6_v2"

#: The poolings of token states into one vector per text.
POOLINGS = ("mean", "cls", "max")


class TextModelError(ValueError):
    """A text network that cannot be used: a missing file, a bad checksum, a tokenizer that does not fit."""


@dataclass(frozen=True)
class TextCard:
    """What a text network is: where it lives, what it gives and how its token states become an output.

    Attributes
    ----------
    name : str
        The catalogue name, or the folder for a user's network.
    task : str
        ``embedding`` (a vector per text, pooled from the token states) or ``classification`` (logits
        over ``labels``, a Hugging Face ``...ForSequenceClassification``).
    uri : str
        The folder: ``pkg://package/path`` for the catalogue, a path otherwise.
    sha256 : dict
        sha256 of each file of the folder that is checked before loading (catalogue entries).
    max_length : int
        Tokens per text that the network was trained on (special tokens included).
    pooling, normalize : str, bool
        For embeddings: ``mean`` (over the attention mask), ``cls`` or ``max``, then L2 norm or not.
    dim : int
        Output size: the embedding's width or the number of labels.
    labels : list of str
        Class names of a classifier, by index.
    """

    name: str
    task: str
    uri: str
    sha256: dict[str, str] = field(default_factory=dict)
    max_length: int = 512
    pooling: str = "mean"
    normalize: bool = False
    dim: int = 0
    labels: tuple[str, ...] = ()
    package: str = ""
    license: str = ""
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _read_catalogue() -> dict[str, TextCard]:
    text = resources.files("irbis.models").joinpath("text_catalogue.json").read_text()
    entries = json.loads(text)["models"]
    cards = {}
    for entry in entries:
        fields: dict[str, Any] = {k: (tuple(v) if k == "labels" else v) for k, v in entry.items()}
        cards[entry["name"]] = TextCard(**fields)
    return cards


#: The text networks of the catalogue, by name.
TEXT_MODELS: dict[str, TextCard] = _read_catalogue()

_VERIFIED: set[str] = set()


def text_folder(card: TextCard) -> Path:
    """The local folder of ``card``, its files' checksums verified (once per process)."""
    from irbis.models.fetch import resolve_uri, verify_file

    try:
        folder = Path(resolve_uri(card.uri))
    except FileNotFoundError as err:
        hint = f" (pip install {card.package})" if card.package else ""
        raise TextModelError(f"text network {card.name!r}: {err}{hint}") from None
    if card.name not in _VERIFIED:
        for name, digest in card.sha256.items():
            if not (folder / name).is_file():
                raise TextModelError(f"text network {card.name!r}: {folder / name} is missing")
            verify_file(folder / name, digest, f"text network {card.name!r}")
        _VERIFIED.add(card.name)
    return folder


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def card_of_folder(folder: str | os.PathLike[str]) -> TextCard:
    """The card of a Hugging Face-format folder: an encoder, or a sequence classifier with its labels.

    sentence-transformers' files, where present, give the pooling, the norm and the maximum length.
    """
    root = Path(folder)
    for required in ("config.json", "tokenizer.json"):
        if not (root / required).is_file():
            raise TextModelError(f"{root} is not a text network folder: it has no {required} (a Hugging "
                                 "Face-format folder holds config.json, model.safetensors and tokenizer.json)")
    if not any(root.glob("*.safetensors")):
        raise TextModelError(f"{root} has no safetensors weights (model.safetensors); Irbis does not unpickle "
                             "pytorch_model.bin: convert it with safetensors first")
    config = _json(root / "config.json")
    classifier = any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or [])
    max_length = int(_json(root / "sentence_bert_config.json").get("max_seq_length")
                     or min(int(config.get("max_position_embeddings", 512)), 512))
    pooling_config = _json(root / "1_Pooling" / "config.json")
    pooling = ("cls" if pooling_config.get("pooling_mode_cls_token") else
               "max" if pooling_config.get("pooling_mode_max_tokens") else "mean")
    modules = json.loads((root / "modules.json").read_text()) if (root / "modules.json").is_file() else []
    normalize = any("Normalize" in m.get("type", "") for m in modules)
    labels: tuple[str, ...] = ()
    if classifier:
        id2label = config.get("id2label") or {}
        labels = tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}")))
                       for i in range(int(config.get("num_labels", len(id2label) or 2))))
    return TextCard(name=str(root), task="classification" if classifier else "embedding", uri=str(root),
                    max_length=max_length, pooling=pooling, normalize=normalize,
                    dim=len(labels) if classifier else int(config.get("hidden_size", 0)), labels=labels)


def text_card(network: str) -> TextCard:
    """The card of ``network``: a catalogue name or a local Hugging Face-format folder."""
    if network in TEXT_MODELS:
        return TEXT_MODELS[network]
    if os.path.isdir(network):
        return card_of_folder(network)
    raise TextModelError(f"network {network!r} is neither a text network of the catalogue "
                         f"({', '.join(sorted(TEXT_MODELS))}) nor a folder holding config.json, "
                         "model.safetensors and tokenizer.json")


def text_source(network: str) -> dict[str, Any]:
    """What a worker needs to load ``network``: its card (as a dict) and its local folder."""
    card = text_card(network)
    folder = text_folder(card) if card.name in TEXT_MODELS else Path(card.uri)
    return {"card": card.to_dict(), "folder": str(folder)}


def card_from_source(source: dict[str, Any]) -> TextCard:
    """The :class:`TextCard` of a :func:`text_source`."""
    card = dict(source["card"])
    card["labels"] = tuple(card.get("labels") or ())
    return TextCard(**card)


def load_text_module(folder: str | os.PathLike[str], card: TextCard) -> Any:
    """The network of ``folder`` as a ``torch.nn.Module`` taking ``(input_ids, attention_mask)`` (int64,
    ``(B, L)``) and returning the card's output: pooled (and normalised) embeddings, or logits.

    The architecture comes from ``config.json`` (``transformers``), the weights from safetensors; a
    weight file that leaves a parameter unset is refused.
    """
    AutoConfig, AutoModel, AutoModelForSequenceClassification = transformers_names(  # noqa: N806
        "AutoConfig", "AutoModel", "AutoModelForSequenceClassification")

    root = Path(folder)
    config = AutoConfig.from_pretrained(str(root), local_files_only=True)
    make = AutoModelForSequenceClassification if card.task == "classification" else AutoModel
    model = make.from_config(config)
    missing = [k for k in load_folder_weights(model, root) if not k.endswith("position_ids")]
    if missing:
        raise TextModelError(f"{root}: the weights leave {len(missing)} parameters of the {type(model).__name__} "
                             f"unset (first: {missing[0]}); the folder's config.json and weights do not match")
    model.eval()
    return _text_network_class()(model, card.task, card.pooling, card.normalize)


def load_folder_weights(model: Any, folder: str | os.PathLike[str]) -> list[str]:
    """Load the safetensors weights of ``folder`` into the ``transformers`` model ``model`` (not strictly): a
    bare encoder's weights go under the model's ``base_model_prefix`` when it wraps one. Returns the model's
    parameter and buffer names the weights left unset."""
    from safetensors.torch import load_file

    weights: dict[str, Any] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        weights.update(load_file(str(file)))
    prefix = getattr(model, "base_model_prefix", "")
    own = set(model.state_dict())
    if prefix and not own & set(weights) and {f"{prefix}.{k}" for k in weights} & own:
        weights = {f"{prefix}.{k}": v for k, v in weights.items()}  # a bare encoder's weights in a wrapper
    return list(model.load_state_dict(weights, strict=False).missing_keys)


_TRANSFORMERS_LOCK = threading.Lock()


def transformers_names(*names: str) -> list[Any]:
    """``transformers``' classes by name, imported under one lock: its lazy module is not safe to import from
    several threads at once (the demo's cross-validation fits folds in threads)."""
    with _TRANSFORMERS_LOCK:
        from irbis.extras import load

        transformers = load("transformers", "text")
        transformers.utils.logging.set_verbosity_error()  # its notes on unused weights are for its own loaders
        return [getattr(transformers, name) for name in names]


@functools.cache
def _text_network_class() -> type:
    """The wrapper module's class, built on first use: importing this module does not import torch."""
    import torch
    from torch import nn

    class _TextNetwork(nn.Module):
        """A Hugging Face model as ``(input_ids, attention_mask) -> embeddings or logits``."""

        def __init__(self, model: nn.Module, task: str, pooling: str, normalize: bool) -> None:
            super().__init__()
            self.model, self.task, self.pooling, self.normalize = model, task, pooling, normalize

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            kwargs = dict(input_ids=input_ids, attention_mask=attention_mask)
            if getattr(self.model.config, "type_vocab_size", 0):
                kwargs["token_type_ids"] = torch.zeros_like(input_ids)
            out = self.model(**kwargs)
            if self.task == "classification":
                return out.logits
            return pool(out.last_hidden_state, attention_mask, self.pooling, self.normalize)

    return _TextNetwork


def pool(states: Any, mask: Any, pooling: str, normalize: bool) -> Any:
    """Token states ``(B, L, H)`` to one vector per row: mean over the mask, the first token, or the max."""
    import torch

    if pooling == "cls":
        out = states[:, 0]
    elif pooling == "max":
        out = states.masked_fill(mask.unsqueeze(-1) == 0, torch.finfo(states.dtype).min).amax(1)
    else:
        weights = mask.unsqueeze(-1).to(states.dtype)
        out = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(out, dim=-1) if normalize else out


def check_tokenizer(tokenizer: Any, folder: str | os.PathLike[str], name: str) -> None:
    """Refuse a tokenizer whose ids do not fit the network's embedding table (``vocab_size`` of config.json)."""
    vocab = int(_json(Path(folder) / "config.json").get("vocab_size", 0))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab and size > vocab:
        raise TextModelError(f"text network {name!r}: its tokenizer has {size} tokens but the network's "
                             f"embedding table has {vocab} rows; the tokenizer.json belongs to another network")
