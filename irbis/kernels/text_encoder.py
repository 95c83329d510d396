"""Run a text network over a batch of texts: tokenize, length-aware batches, the engine, rows back in order.

:func:`text_runner` gives the process's one :class:`TextRunner` per network, options and thread count (a
Spark worker, the HTTP server and a LIME loop share it). A runner tokenizes with ``tokenizers`` (Rust,
parallel over the batch), truncates at ``max_length`` (counting what it cut), runs the network on
length-aware batches (:func:`irbis.kernels.sequences.run_by_length`) and returns one output row per text.

Engines, as for images (:mod:`irbis.kernels.engines`, which loads them and holds the order ``auto`` tries for
each input kind): eager ``torch``, or the network exported once per machine to ONNX with its batch and
sequence axes dynamic and run by ``onnxruntime`` or ``openvino``. ``auto`` runs fp32 on OpenVINO first on the
CPU (on CUDA, eager torch), then eager torch, then ONNX Runtime. On MiniLM over the drug reviews OpenVINO ran
level with eager torch in Irbis's runner on one thread on a CPU with AMX and on an AVX2-only one, where
``TextEmbedder`` too ran level (``benchmarks/results/text_engine_rule.txt``); on an AVX-512 CPU without AMX
``TextEmbedder`` ran OpenVINO at twice torch's speed, ONNX Runtime between them
(``benchmarks/results/text_engine_rule_avx512.txt``). ``benchmarks/text_engine_rule.py`` measures the engines
inside Irbis on the CPU at hand. For bf16 ``auto`` tries OpenVINO on CPUs with bf16 instructions (ahead of torch's
autocast there); for int8, OpenVINO as NNCF quantised the network (its transformer preset, calibrated on
sample texts: :func:`irbis.kernels.engines.quantize.nncf_transformer_path`), else ONNX Runtime's dynamic
quantisation.

Pure: no pyspark. Examples
--------
>>> from irbis.models.text_networks import text_source
>>> runner = text_runner(text_source("all_minilm_l6_v2"), engine="torch")   # doctest: +SKIP
>>> runner.encode(["a cat", "a dog"]).values.shape                            # doctest: +SKIP
(2, 384)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from irbis.kernels.device import task_device
from irbis.kernels.engines import ENGINES, EngineError, cached, candidates, export_lock_path, onnx_path
from irbis.kernels.sequences import PadStats, run_by_length
from irbis.kernels.threads import set_threads, task_threads
from irbis.models.text_networks import TextCard, TextModelError, card_from_source, check_tokenizer

__all__ = ["CHARS_PER_TOKEN", "TEXT_HEADS", "TEXT_TOKEN_BUDGET", "TextBatch", "TextKernel", "TextRunner",
           "TextTokens", "check_reasons", "decode_texts", "text_runner", "text_tokens"]

#: Characters kept per token of ``max_length`` before tokenizing: a 10 MB string costs no more than a
#: text of ``64 x max_length`` characters (WordPiece and BPE tokens are far shorter than 64 characters,
#: so the cap never removes a token that truncation would have kept).
CHARS_PER_TOKEN = 64

#: Padded tokens per batch of a text network at inference (``tokenBudget`` of the text stages). A CPU
#: gains little from larger batches of a transformer (its cost is linear in the tokens), while a larger
#: budget lets longer rows share a batch with shorter ones, and pads them to the longest: a Spark task's
#: window of rows, or a drain of the HTTP server's requests, pads less under 1024 than under 4096
#: (``benchmarks/text.py`` measures the stage at this default: ``benchmarks/results/text.txt``). Training
#: keeps its own budget: it sets the rows of a step.
TEXT_TOKEN_BUDGET = 1024

TRUNCATIONS = ("truncate", "error")
#: Words of the short texts int8 calibration adds, one per calibration text (:meth:`TextRunner._nncf_int8`).
SHORT_WORDS = 3


@dataclass
class TextBatch:
    """A runner's answer for N texts: the M outputs of the texts it ran, which rows those are, and why
    the others have none."""

    values: np.ndarray
    valid: np.ndarray
    errors: list[str | None]
    truncated: int = 0
    stats: PadStats = field(default_factory=PadStats)


def decode_texts(block: Any, column: str, stage: str) -> tuple[list[str | None], list[str | None]]:
    """A string or binary block as texts (``None`` for nulls) and a reason per row that cannot be a text.

    Binary rows are decoded as UTF-8; a row that is not UTF-8 gets ``None`` and a reason naming the row.
    """
    from irbis.kernels.blocks import Binary

    if isinstance(block, Binary):
        rows = [block[i] for i in range(len(block))]
    else:
        rows = list(block)
    texts: list[str | None] = []
    errors: list[str | None] = []
    for i, row in enumerate(rows):
        if row is None:
            texts.append(None)
            errors.append("null text")
        elif isinstance(row, str):
            texts.append(row)
            errors.append(None)
        elif isinstance(row, (bytes, bytearray, memoryview)):
            try:
                texts.append(bytes(row).decode("utf-8"))
                errors.append(None)
            except UnicodeDecodeError as err:
                texts.append(None)
                errors.append(f"{stage}: column {column!r} row {i} is not UTF-8 text ({err.reason} at byte "
                              f"{err.start})")
        else:
            raise TypeError(f"{stage}: column {column!r} must hold strings (or UTF-8 bytes), found "
                            f"{type(row).__name__}")
    return texts, errors


class TextTokens:
    """A text network's tokenizer, truncating at ``max_length`` (0: the card's maximum) and padding nothing."""

    def __init__(self, source: dict[str, Any], max_length: int = 0) -> None:
        from irbis.extras import load

        Tokenizer = load("tokenizers", "text").Tokenizer
        card = card_from_source(source)
        folder = Path(source["folder"])
        self.max_length = min(max_length or card.max_length, card.max_length)
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TextModelError(f"text network {card.name!r}: {tokenizer_file} is missing")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        check_tokenizer(self.tokenizer, folder, card.name)
        padding = self.tokenizer.padding
        self.pad_id = int(padding["pad_id"]) if padding else 0
        self.tokenizer.no_padding()
        # one token more than kept, so that a text of exactly max_length is not counted as cut
        self.tokenizer.enable_truncation(self.max_length + 1)

    def tokenize(self, texts: Sequence[str]) -> tuple[list[np.ndarray], np.ndarray]:
        """Token ids of each text (special tokens included, at most ``max_length``) and which were cut.

        A cut text keeps its first ``max_length - 1`` tokens and its last special token.
        """
        cap = CHARS_PER_TOKEN * self.max_length
        capped = [t if len(t) <= cap else t[:cap] for t in texts]
        encodings = self.tokenizer.encode_batch(capped, add_special_tokens=True)
        ids, cut = [], np.zeros(len(texts), bool)
        for i, enc in enumerate(encodings):
            row = np.asarray(enc.ids, dtype=np.int64)
            if len(row) > self.max_length or len(capped[i]) < len(texts[i]):
                cut[i] = True
                row = np.concatenate([row[:self.max_length - 1], row[-1:]]) if len(row) > self.max_length else row
            ids.append(row)
        return ids, cut


class TextRunner:
    """A text network, its tokenizer and one engine, loaded once per process and options.

    Parameters
    ----------
    source : dict
        :func:`irbis.models.text_networks.text_source` of the network (its card and folder).
    engine, precision, device : str
        As the network stages' Params: ``auto``/``torch``/``onnxruntime``/``openvino``; ``fp32``/
        ``bf16``/``int8``; ``cpu``/``cuda``/``auto``.
    max_length : int
        Tokens per text (special tokens included); 0: the card's.
    truncation : str
        ``truncate`` (cut longer texts at ``max_length`` and count them) or ``error`` (a longer text gets
        no output and a reason).
    token_budget, max_rows : int
        A batch holds at most ``token_budget`` padded tokens and ``max_rows`` texts.
    calibration : str
        int8 on OpenVINO: the folder of the texts that set the activation ranges
        (:func:`irbis.kernels.calibration.text_calibration`; empty: texts that ship with Python).
    """

    def __init__(self, source: dict[str, Any], *, engine: str = "auto", precision: str = "fp32",
                 device: str = "cpu", max_length: int = 0, truncation: str = "truncate",
                 token_budget: int = TEXT_TOKEN_BUDGET, max_rows: int = 128, calibration: str = "") -> None:
        self.card: TextCard = card_from_source(source)
        self.folder = Path(source["folder"])
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {truncation!r}")
        self.truncation, self.token_budget, self.max_rows = truncation, token_budget, max_rows
        self.tokens = text_tokens(source, max_length)
        self.max_length, self.pad_id = self.tokens.max_length, self.tokens.pad_id
        self.device = task_device(device)
        self.calibration = calibration
        self.engine, self._run = self._load_engine(engine, precision)
        self.lock = threading.Lock()

    def tokenize(self, texts: Sequence[str]) -> tuple[list[np.ndarray], np.ndarray]:
        """Token ids of each text and which were cut (:meth:`TextTokens.tokenize`)."""
        return self.tokens.tokenize(texts)

    # -- running ---------------------------------------------------------------------------------
    def run_ids(self, rows: Sequence[np.ndarray]) -> tuple[np.ndarray, PadStats]:
        """The network's output for each row of token ids, in order, over length-aware batches."""
        with self.lock:
            set_threads(task_threads())
            out, stats = run_by_length(rows, self._run, token_budget=self.token_budget, max_rows=self.max_rows,
                                       pad_id=self.pad_id)
        if not len(rows):
            out = np.zeros((0, self.card.dim), np.float32)
        return out.astype(np.float32, copy=False), stats

    def encode(self, texts: Sequence[str | None], errors: Sequence[str | None] | None = None) -> TextBatch:
        """Outputs of the texts that are strings; a null (or an ``errors`` entry) gives no output and its reason."""
        errors = list(errors) if errors is not None else [None] * len(texts)
        keep = [i for i, t in enumerate(texts) if t is not None and errors[i] is None]
        for i, t in enumerate(texts):
            if t is None and errors[i] is None:
                errors[i] = "null text"
        ids, cut = self.tokenize([texts[i] for i in keep])  # type: ignore[misc]
        if self.truncation == "error" and cut.any():
            for k in np.flatnonzero(cut):
                errors[keep[k]] = (f"text of more than maxLength={self.max_length} tokens (truncation='error'; "
                                   "set truncation='truncate' to cut it)")
            ids = [r for r, c in zip(ids, cut) if not c]
            keep = [i for i, c in zip(keep, cut) if not c]
        values, stats = self.run_ids(ids)
        valid = np.zeros(len(texts), bool)
        valid[keep] = True
        return TextBatch(values, valid, errors, int(cut.sum()) if self.truncation == "truncate" else 0, stats)

    # -- engines ---------------------------------------------------------------------------------
    def _load_engine(self, engine: str, precision: str) -> tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
        failures = []
        for name in candidates(engine, self.device, precision, kind="text"):
            try:
                return name, self._engine(name, precision)
            except (EngineError, ImportError) as err:
                if engine != "auto":
                    raise
                failures.append(f"{name}: {err}")
        raise EngineError(f"no engine runs text network {self.card.name!r}: " + "; ".join(failures))

    def _engine(self, name: str, precision: str) -> Callable[..., Any]:
        if name == "torch":
            return self._torch(precision)
        ENGINES[name].require()
        path = str(self._export())
        if name == "openvino" and precision == "int8":  # the quantised graph runs its int8 operations as such
            path, precision = str(self._nncf_int8(path)), "fp32"
        return ENGINES[name].load(path, threads=task_threads(), device=self.device, precision=precision)

    def _torch(self, precision: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        import torch

        from irbis.models.text_networks import load_text_module

        if precision == "int8":
            raise EngineError("engine='torch' runs text at fp32 or bf16; "
                              "int8 runs on engine='openvino' or 'onnxruntime'")
        module = load_text_module(self.folder, self.card).to(self.device)
        autocast = precision == "bf16"

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.inference_mode(), torch.autocast(self.device, dtype=torch.bfloat16, enabled=autocast):
                out = module(torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device))
            return out.float().cpu().numpy()

        return run

    def _nncf_int8(self, path: str) -> Path:
        """The NNCF int8 model of the exported network, calibrated on :attr:`calibration`'s texts."""
        from irbis.kernels.calibration import text_calibration
        from irbis.kernels.engines.quantize import nncf_transformer_path
        from irbis.kernels.sequences import length_batches, pad_rows, padded_length

        if importlib.util.find_spec("nncf") is None:
            raise ImportError("precision='int8' on engine='openvino' needs NNCF (pip install 'irbis[engines]')")
        key, texts = text_calibration(self.calibration)

        def batches() -> list[tuple[np.ndarray, np.ndarray]]:
            # each text and its first words: with few real tokens the special tokens' activations dominate,
            # and long texts alone leave their ranges unseen (the shortest reviews lost the most without them:
            # benchmarks/text.py measures the sample with and without them)
            ids, _ = self.tokenize(texts + [" ".join(t.split()[:SHORT_WORDS]) for t in texts])
            lengths = np.array([len(r) for r in ids])
            return [pad_rows([ids[i] for i in b], padded_length(lengths[b]), self.pad_id)
                    for b in length_batches(lengths, token_budget=self.token_budget, max_rows=8)]

        return nncf_transformer_path(path, f"{key}-{self.max_length}-{SHORT_WORDS}", batches)

    def _export(self) -> Path:
        """The network's ONNX file (batch and sequence axes dynamic), written once per machine."""
        from irbis.models.fetch import file_lock

        path = onnx_path(f"text-{network_key(self.folder, self.card)}")
        with file_lock(export_lock_path(path)):
            if not path.exists():
                write_text_onnx(self.folder, self.card, path)
        return path


def network_key(folder: Path, card: TextCard) -> str:
    """A key of the network's identity: its files' checksums and how its output is pooled."""
    from irbis.models.fetch import cached_sha256

    digest = hashlib.sha256(json.dumps([card.task, card.pooling, card.normalize], sort_keys=True).encode())
    for file in sorted(folder.glob("*.safetensors")) + [folder / "config.json"]:
        digest.update(f"{file.name}:{cached_sha256(file)}|".encode())
    return digest.hexdigest()[:24]


def write_text_onnx(folder: Path, card: TextCard, path: Path) -> None:
    """Export the text network of ``folder`` to ``path``: inputs ``input_ids`` and ``attention_mask`` (int64,
    batch and sequence axes dynamic), one output (embeddings or logits)."""
    import warnings

    import torch

    from irbis.kernels.engines.export import _quiet
    from irbis.models.fetch import atomic_path
    from irbis.models.text_networks import load_text_module

    module = load_text_module(folder, card)
    ids = torch.ones((2, 16), dtype=torch.int64)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=card.max_length)
    try:
        with torch.no_grad(), warnings.catch_warnings(), _quiet():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, (ids, torch.ones_like(ids)), dynamo=True, optimize=True,
                                        verbose=False, input_names=["input_ids", "attention_mask"],
                                        output_names=["text_output"],
                                        dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    except Exception as err:  # noqa: BLE001 - the exporter fails in many ways; report its reason
        raise EngineError(f"the text network cannot be exported to ONNX: {str(err).splitlines()[0][:300]}") from err
    if program is None:  # torch.onnx.export with dynamo=True returns the program
        raise EngineError("the text network cannot be exported to ONNX: the exporter returned no program")
    with atomic_path(path) as tmp:
        program.save(str(tmp))


def text_tokens(source: dict[str, Any], max_length: int = 0) -> TextTokens:
    """The process's :class:`TextTokens` of ``source`` at ``max_length`` (:func:`irbis.kernels.engines.cached`)."""
    key = json.dumps(["tokens", source, max_length], sort_keys=True, default=str)
    return cached(key, lambda: TextTokens(source, max_length))


def text_runner(source: dict[str, Any], **options: Any) -> TextRunner:
    """The process's :class:`TextRunner` of ``source`` and ``options`` (one per thread count too)."""
    key = json.dumps(["text", source, options, task_threads()], sort_keys=True, default=str)
    return cached(key, lambda: TextRunner(source, **options))


#: What a :class:`TextKernel` gives, and the names of its output columns (the keys of ``outputs``).
TEXT_HEADS = {"embedding": ("embedding",), "classification": ("raw", "probability", "prediction"),
              "tokens": ("tokens",)}


class TextKernel:
    """A text stage's kernel as a plain, picklable value: the network, the runner's options, the text column
    and the outputs; called on a dict of column blocks, it gives the output blocks.

    ``head`` is ``embedding`` (one vector per text), ``classification`` (the logits, their softmax and the
    index of the largest, as a double) or ``tokens`` (the token ids, ``array<int>``); ``outputs`` maps each
    of the head's outputs (:data:`TEXT_HEADS`) to its column (empty: left out). A network of the catalogue is
    looked up again where the kernel runs; a folder of one's own is read where :attr:`files` says, which a
    runner that moves the kernel to another machine rewrites with :meth:`relocated`.

    Parameters
    ----------
    network : str
        A text network of the catalogue or a Hugging Face-format folder.
    source : dict
        :func:`irbis.models.text_networks.text_source` of the network.
    column : str
        The text column (strings, or UTF-8 bytes).
    head : str
        A key of :data:`TEXT_HEADS`.
    outputs : dict
        Output name of the head -> column.
    options : dict
        :class:`TextRunner`'s options (``engine``, ``precision``, ``device``, ``max_length``, ``truncation``,
        ``token_budget``, ``max_rows``, ``calibration``).
    error_col : str
        Column of each row's reason when it has no output (empty: none, and a bad row fails the batch).
    stage : str
        The stage's name, for messages.
    """

    def __init__(self, network: str, source: dict[str, Any], column: str, *, head: str, outputs: dict[str, str],
                 options: dict[str, Any], error_col: str = "", stage: str = "") -> None:
        if head not in TEXT_HEADS:
            raise ValueError(f"head must be one of {list(TEXT_HEADS)}, got {head!r}")
        self.network, self.source, self.column, self.head = network, source, column, head
        self.outputs, self.options, self.error_col, self.stage = outputs, options, error_col, stage
        self._loaded: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_loaded": None}  # the runner stays in the process that loaded it

    @property
    def files(self) -> tuple[str, ...]:
        """The local paths the kernel reads: a folder of one's own (a catalogue network is found where it runs)."""
        from irbis.models.text_networks import TEXT_MODELS

        return () if self.network in TEXT_MODELS else (self.source["folder"],)

    def relocated(self, paths: dict[str, str]) -> TextKernel:
        """This kernel reading each of its :attr:`files` at ``paths[file]`` (a copy shipped to this machine)."""
        folder = paths.get(self.source["folder"], self.source["folder"])
        return TextKernel(self.network, dict(self.source, folder=folder), self.column, head=self.head,
                          outputs=self.outputs, options=self.options, error_col=self.error_col, stage=self.stage)

    def _here(self) -> dict[str, Any]:
        from irbis.models.text_networks import TEXT_MODELS, text_source

        return text_source(self.network) if self.network in TEXT_MODELS else self.source

    def runner(self) -> TextRunner:
        """The process's runner of the network, looked up at the first batch and kept for the later ones."""
        if not isinstance(self._loaded, TextRunner):
            self._loaded = text_runner(self._here(), **self.options)
        return self._loaded

    def tokens(self) -> TextTokens:
        """The process's tokenizer of the network at ``max_length``."""
        if self._loaded is None:
            self._loaded = text_tokens(self._here(), self.options.get("max_length", 0))
        return self._loaded.tokens if isinstance(self._loaded, TextRunner) else self._loaded

    def measure(self, values: list[Any]) -> np.ndarray:
        """The length in tokens of each text of ``values`` as the runner batches it; a null, or bytes that are
        not UTF-8, count as empty (:class:`irbis.kernels.chain.LengthRule`)."""
        texts, _ = decode_texts(values, self.column, self.stage)
        ids, _ = self.tokens().tokenize([t or "" for t in texts])
        return np.array([len(r) for r in ids], np.int64)

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        from irbis.kernels.blocks import Tensor

        texts, errors = decode_texts(blocks[self.column], self.column, self.stage)
        if self.head == "tokens":
            return self._tokens(texts, errors)
        batch = self.runner().encode(texts, errors)
        check_reasons(batch.errors, batch.valid, self.error_col)
        if self.head == "embedding":
            out: dict[str, Any] = {self.outputs["embedding"]: Tensor(batch.values, batch.valid)}
        else:
            out = self._classes(batch)
        return {**out, self.error_col: batch.errors} if self.error_col else out

    def _classes(self, batch: TextBatch) -> dict[str, Any]:
        from irbis.kernels.blocks import Tensor
        from irbis.kernels.inference import class_outputs

        raw, prob, pred = (self.outputs.get(name, "") for name in TEXT_HEADS["classification"])
        logits = Tensor(batch.values.astype(np.float64), batch.valid)
        return {**({raw: logits} if raw else {}), **class_outputs(logits, prob, pred)}

    def _tokens(self, texts: list[str | None], errors: list[str | None]) -> dict[str, Any]:
        tokenizer = self.tokens()
        keep = [i for i, t in enumerate(texts) if t is not None and errors[i] is None]
        ids, cut = tokenizer.tokenize([texts[i] for i in keep])  # type: ignore[misc]
        rows: list[Any] = [None] * len(texts)
        for k, i in enumerate(keep):
            if cut[k] and self.options.get("truncation", "truncate") == "error":
                errors[i] = f"text of more than maxLength={tokenizer.max_length} tokens (truncation='error')"
            else:
                rows[i] = ids[k].astype(np.int32)
        valid = np.array([r is not None for r in rows], bool)
        check_reasons(errors, valid, self.error_col)
        out: dict[str, Any] = {self.outputs["tokens"]: rows}
        return {**out, self.error_col: [None if v else e for v, e in zip(valid, errors)]} if self.error_col else out


def check_reasons(errors: list[str | None], valid: np.ndarray, err_col: str) -> None:
    """Without an error column, the first row that has no output for a reason other than a null fails the batch."""
    if err_col:
        return
    for i, reason in enumerate(errors):
        if not valid[i] and reason and reason != "null text":
            raise ValueError(reason)
