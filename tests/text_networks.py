"""Text networks that the tests build once per run: Hugging Face-format folders with seeded weights.

``tiny_text_network("embedding")`` is a 2-layer, 32-wide BERT encoder and ``tiny_text_network("classification")``
the same with a 3-class head; both use the catalogue encoder's real tokenizer, so they read any text, and run
in milliseconds. ``minilm_classifier()`` is the catalogue's MiniLM with a seeded 3-class head, a real-sized
sequence classifier in the layout a user's fine-tuned model has.
"""
from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

LABELS = ("negative", "neutral", "positive")


def _tokenizer_file() -> Path:
    from irbis.models.text_networks import TEXT_MODELS, text_folder

    return text_folder(TEXT_MODELS["all_minilm_l6_v2"]) / "tokenizer.json"


@functools.cache
def tiny_text_network(task: str = "embedding") -> str:
    """The folder of a seeded tiny BERT encoder (``embedding``) or 3-class classifier (``classification``)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512,
                        id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    model = BertForSequenceClassification(config) if task == "classification" else BertModel(config)
    folder = Path(tempfile.mkdtemp(prefix=f"irbis-text-{task}-"))
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(_tokenizer_file(), folder / "tokenizer.json")
    return str(folder)


@functools.cache
def minilm_classifier() -> str:
    """The folder of the catalogue's MiniLM encoder under a seeded 3-class head (BertForSequenceClassification)."""
    import torch
    from safetensors.torch import load_file
    from transformers import BertConfig, BertForSequenceClassification

    from irbis.models.text_networks import TEXT_MODELS, text_folder

    source = text_folder(TEXT_MODELS["all_minilm_l6_v2"])
    config = BertConfig.from_pretrained(str(source), num_labels=3, id2label=dict(enumerate(LABELS)),
                                        label2id={n: i for i, n in enumerate(LABELS)},
                                        architectures=["BertForSequenceClassification"])
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    model.bert.load_state_dict(load_file(str(source / "model.safetensors")), strict=False)
    folder = Path(tempfile.mkdtemp(prefix="irbis-text-minilm-classifier-"))
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    return str(folder)
