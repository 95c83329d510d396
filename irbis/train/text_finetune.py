"""The network of a text fine-tuning job: a pretrained text encoder with a new classifier head.

:class:`TextFinetune` is the module factory that :class:`irbis.ml.TextClassifier` hands to the training
loop: every worker builds the same network from it. The network is the encoder's Hugging Face
``...ForSequenceClassification`` (``transformers``' own architecture for the encoder's ``config.json``:
the encoder, its pooler and a new ``numClasses`` linear head drawn from ``seed``), with the encoder's
pretrained weights read from safetensors. It takes the training loop's padded batches (``input_kind =
"padded"``: ids and mask) and returns logits.

:func:`write_classifier_folder` writes the trained network as a Hugging Face-format folder
(``config.json`` naming the classifier, ``model.safetensors``, the encoder's ``tokenizer.json``): the
folder that :class:`irbis.ml.TextClassifierModel` scores, serves and saves like any user's classifier.

Pure: no pyspark.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["TextFinetune", "classifier_config", "write_classifier_folder"]

#: Files of the encoder's folder that the classifier's folder keeps (the tokenizer and its settings).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def classifier_config(folder: str | Path, num_classes: int, labels: list[str] | None = None,
                      dropout: float | None = None) -> Any:
    """The encoder's ``config.json`` as a ``num_classes`` sequence classifier's (its architecture's
    ``...ForSequenceClassification``), with the label names (``"0"``, ``"1"``, ... when none are given)."""
    from irbis.models.text_networks import transformers_names

    (AutoConfig,) = transformers_names("AutoConfig")  # noqa: N806
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    names = list(labels) if labels else [str(i) for i in range(num_classes)]
    if len(names) != num_classes:
        raise ValueError(f"labels has {len(names)} names for numClasses={num_classes}")
    config.num_labels = int(num_classes)
    config.id2label = dict(enumerate(names))
    config.label2id = {n: i for i, n in enumerate(names)}
    config.problem_type = "single_label_classification"
    if dropout is not None and hasattr(config, "classifier_dropout"):
        config.classifier_dropout = float(dropout)
    return config


@dataclass(frozen=True)
class TextFinetune:
    """A picklable factory of the fine-tuning network: the encoder of ``source`` (a
    :func:`irbis.models.text_networks.text_source`; its folder found again on the worker by ``locate``) with a new
    ``num_classes`` head drawn from ``seed``, frozen up to the ``named_modules()`` layer ``freeze``
    (empty: every layer trains; :func:`irbis.train.finetune.freeze_until` names the valid layers)."""

    source: dict[str, Any]
    num_classes: int
    freeze: str = ""
    seed: int = 0
    pretrained: bool = True
    dropout: float | None = None
    labels: tuple[str, ...] = ()
    locate: Callable[[], str] | None = None  # a user's folder on this machine (e.g. shipped to executors)

    def folder(self) -> Path:
        """The encoder's folder on this machine (the catalogue's checked, a user's found by ``locate``)."""
        from irbis.models.text_networks import TEXT_MODELS, text_source

        name = self.source["card"]["name"]
        if name in TEXT_MODELS:
            return Path(text_source(name)["folder"])
        return Path(self.locate() if self.locate is not None else self.source["folder"])

    def __call__(self) -> nn.Module:
        from irbis.models.text_networks import TextModelError, card_from_source, load_folder_weights, transformers_names
        from irbis.train.finetune import freeze_until

        (AutoModelForSequenceClassification,) = transformers_names("AutoModelForSequenceClassification")  # noqa: N806

        folder = self.folder()
        card = card_from_source(self.source)
        if card.task != "embedding":
            raise ValueError(f"backbone {card.name!r} is a sequence classifier already; TextClassifier puts a new "
                             "head on an encoder (a sentence encoder or any Hugging Face encoder folder)")
        config = classifier_config(folder, self.num_classes, list(self.labels) or None, self.dropout)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.seed))  # the new head (and any layer the weights leave unset)
            model = AutoModelForSequenceClassification.from_config(config)
        if self.pretrained:  # the new head is the only part the encoder's weights may leave unset
            prefix = model.base_model_prefix
            unset = [k for k in load_folder_weights(model, folder)
                     if k.startswith(prefix + ".") and not k.endswith("position_ids")]
            if unset:
                raise TextModelError(f"{folder}: the encoder's weights leave {len(unset)} of its parameters unset "
                                     f"(first: {unset[0]}); config.json and the weights do not match")
        net = _classifier_network(model)
        if self.freeze:
            freeze_until(net, self.freeze)
        return net


def _classifier_network(model: nn.Module) -> nn.Module:
    """``model`` (a ``...ForSequenceClassification``) as ``(ids, mask) -> logits``, declaring padded input."""
    from irbis.models.text_networks import _text_network_class

    net = _text_network_class()(model, "classification", "cls", False)
    net.input_kind = "padded"
    return net


def write_classifier_folder(net: nn.Module, encoder_folder: str | Path, folder: str | Path,
                            max_length: int) -> Path:
    """Write the trained network ``net`` (from :class:`TextFinetune`) as a Hugging Face-format classifier
    folder: ``config.json`` (the classifier's architecture and labels), ``model.safetensors`` and the
    encoder's tokenizer files; ``max_length`` is kept in ``sentence_bert_config.json`` as the texts' limit."""
    from safetensors.torch import save_model

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model: Any = net.model  # a transformers model: its config is read as it is
    model.config.architectures = [type(model).__name__]
    model.config.to_json_file(str(out / "config.json"))
    save_model(model.eval(), str(out / "model.safetensors"))
    for name in TOKENIZER_FILES:
        if (Path(encoder_folder) / name).is_file():
            shutil.copyfile(Path(encoder_folder) / name, out / name)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": int(max_length)}))
    return out
