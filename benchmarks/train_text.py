"""Fine-tuning MiniLM on the drug reviews: Irbis's TextClassifier on Spark against plain PyTorch and TorchDistributor.

The texts are the UCI drug reviews that ship with the project's data (:func:`irbis.demo.reviews.drug_reviews`:
600 training and 379 held-out test reviews). The task is the sentiment of the review's rating: label 1 for
``positive`` (a rating of 7 or more), 0 for the rest (``neutral`` and ``negative``).

Every side does the same work, measured in the same run:

* the network: :class:`irbis.train.text_finetune.TextFinetune` (the catalogue's ``all_minilm_l6_v2``, its
  BertForSequenceClassification with the pretrained encoder weights and a new 2-class head drawn from seed 0,
  dropout 0.1), every layer trained;
* the optimizer: Adam, the head at 1e-3 and the encoder at 1e-4 (TextClassifier's defaults: ``learningRate``
  1e-3, ``backboneLearningRateFactor`` 0.1), constant rate, torch's fused kernel (``fused=True``, as Irbis
  builds it) on every side;
* the texts: the encoder's own ``tokenizer.json``, truncated at ``maxLength`` 256 tokens (special tokens
  included), each batch padded to its longest text;
* the data: the same training reviews, ``EPOCHS`` epochs, global batch 16 (one process x 16, or two x 8);
* the test: every row's final weights scored by one function (the same tokens, eval mode, argmax) on the
  same held-out reviews.

Rows:

  (a) plain PyTorch, one process, torch 2 threads: the reviews tokenized with ``tokenizers`` up front, then
      forward and backward over length-grouped batches (each epoch's seeded permutation cut into chunks of
      ``GROUP_CHUNK`` batches, each chunk sorted by length and cut into batches, the batches' order
      shuffled). Its settings are tuned first on short runs (OpenMP's default wait policy and
      ``OMP_WAIT_POLICY=PASSIVE``), and the same runs time plain shuffled batches (the permutation cut into
      batches): the padding waste and speed of length grouping.
  (b) ``TorchDistributor(local_mode=True, num_processes=2, use_gpu=False)``: DDP over gloo, each process one
      torch thread with a torch DataLoader (a batch sampler and a padding collate) over its half of every
      global batch: the global batches are length-grouped as (a)'s and each process takes every second
      row of each, so the two halves have the same lengths, as a user who knows the padding cost would
      do. Its DataLoader ``num_workers`` (0 or 1) is tuned first on short runs.
  (c) Spark local[2]: ``TextClassifier(backbone="all_minilm_l6_v2", inputCol="text", labelCol="label",
      numClasses=2, epochs=E, batchSize=8, maxLength=256, numWorkers=2, seed=0, showProgress=False)`` (8 texts
      a worker and step: the global batch of 16) on a
      DataFrame of the texts and labels (made from pandas): the texts tokenized in the Spark workers and
      trained on by TorchEstimator in length-bucketed batches; its ``sync`` all-reduce sends of the vocabulary's
      embedding table only the rows some worker's batch touched (the same mean as DDP's dense all-reduce,
      :func:`irbis.train.strategy.all_reduce_mean`). Where it cannot train (the row reports its
      error as "(c) not available"), (a) and (b) are reported all the same.

Each side runs on the training reviews (``EPOCHS`` epochs) and on the training reviews repeated ``REPEATS``
times (1 epoch): the end-to-end rates once the fixed costs of a call are spread over more samples.

On a CPU with bf16 instructions (AMX or AVX-512 bf16) the ``REPEATS`` rows run again in mixed precision: (a)
and (b) with each step's forward pass and loss under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (at the
settings tuned in fp32), (c) with ``trainingPrecision="bf16"``, which does the same in its workers. Weights,
gradients, Adam and what the processes exchange stay fp32 on every side.

samples/s e2e: training samples (reviews x epochs) over the wall time of the whole call: for (a) from reading
the texts (tokenizing them included) to the last step, for (b) ``TorchDistributor.run``, for (c) from making
the DataFrame to the fitted model (every Spark job, the tokenization in the workers and the Python workers'
start; the session itself is started before the clock). loop samples/s: over the training loop's own time
(for (c) the slowest worker's ``loop_seconds`` in ``last_estimator.last_results``). Memory: the peak of the
summed resident memory (RSS, sampled from /proc every 0.25 s, with the sampler of ``train_images.py``) of the
processes that train: (a) the process, (b) the two DDP processes and their DataLoader workers, (c) the Spark
Python workers; and the largest single process's peak (``VmHWM``). Padding waste: the tokens of the padded
batches over the real tokens, over every batch of an epoch's order (1.00: no padding).

Every row runs in a fresh process (a fresh Spark session for the Spark rows), one after the other.

Usage (the machine has 2 cores: run benchmarks one at a time, under the shared lock)::

    flock /tmp/irbis-bench.lock .venv/bin/python benchmarks/train_text.py
    nice -n 10 .venv/bin/python benchmarks/train_text.py --quick                      # a check that it runs

``--quick``: 32 training and 32 test reviews, 1 epoch, data grown 2x, tuned on 1 step: nothing is written.
A full run writes ``benchmarks/results/train_text.txt`` and ``train_text.json``.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import train_images as ti  # the rows' processes, their memory and CPU sampler and clock
from provenance import Run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 3
BACKBONE, NUM_CLASSES, DROPOUT, SEED = "all_minilm_l6_v2", 2, 0.1, 0
HEAD_LR, BACKBONE_FACTOR = 1e-3, 0.1
GLOBAL_BATCH, MAX_LENGTH = 16, 256
#: Batches per length-sorted chunk of length-grouped batches.
GROUP_CHUNK = 50
EPOCHS, QUICK_EPOCHS = 2, 1
REPEATS, QUICK_REPEATS = 8, 2
#: Training and test reviews of --quick (a full run takes them all).
QUICK_ROWS = 32
#: Steps timed per setting when tuning (a) and (b), after one untimed one.
TUNE_STEPS = 20
SPARK_CONF = {"spark.ui.enabled": "false"}
PACKAGES = ("torch", "pyspark", "transformers", "tokenizers", "numpy", "pyarrow")


# -- the data ----------------------------------------------------------------------------------------------------
def write_data(root: Path, rows: int | None, repeats: int) -> dict:
    """The reviews as JSON files under ``root``: ``train``, ``test`` and ``grown`` (the training reviews
    ``repeats`` times), each ``{"text": [...], "label": [...]}``; ``rows``: only the first ones of each split."""
    from irbis.demo.reviews import drug_reviews

    paths = {}
    for split in ("train", "test"):
        frame = drug_reviews(split)[:rows]
        data = {"text": frame["review"].tolist(), "label": (frame["sentiment"] == "positive").astype(int).tolist()}
        paths[split] = root / f"{split}.json"
        paths[split].write_text(json.dumps(data))
        if split == "train":
            paths["grown"] = root / f"train_x{repeats}.json"
            paths["grown"].write_text(json.dumps({k: v * repeats for k, v in data.items()}))
    return {k: str(v) for k, v in paths.items()}


def read_data(path: str) -> tuple[list[str], np.ndarray]:
    data = json.loads(Path(path).read_text())
    return data["text"], np.asarray(data["label"], np.int64)


def token_ids(texts: list[str]) -> tuple[list[np.ndarray], int]:
    """The texts' token ids with the encoder's ``tokenizer.json`` (``tokenizers`` directly: special tokens
    added, truncated at MAX_LENGTH, no padding), and the padding id."""
    from tokenizers import Tokenizer

    from irbis.models.text_networks import text_source

    tok = Tokenizer.from_file(str(Path(text_source(BACKBONE)["folder"]) / "tokenizer.json"))
    pad_id = int(tok.padding["pad_id"]) if tok.padding else 0
    tok.no_padding()
    tok.enable_truncation(MAX_LENGTH)
    return [np.asarray(e.ids, np.int64) for e in tok.encode_batch(texts, add_special_tokens=True)], pad_id


def batch_order(lengths: np.ndarray, batch: int, epoch: int, grouped: bool, seed: int = SEED) -> list[np.ndarray]:
    """Epoch ``epoch``'s batches of row indices: plain shuffled (a seeded permutation cut into batches), or
    length-grouped (the permutation cut into chunks of GROUP_CHUNK batches, each chunk sorted by length and
    cut into batches, the batches' order shuffled)."""
    rng = np.random.default_rng([seed, 99, epoch])
    perm = rng.permutation(len(lengths))
    if not grouped:
        return [perm[i:i + batch] for i in range(0, len(perm), batch)]
    batches = []
    for start in range(0, len(perm), batch * GROUP_CHUNK):
        part = perm[start:start + batch * GROUP_CHUNK]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches += [part[i:i + batch] for i in range(0, len(part), batch)]
    return [batches[i] for i in rng.permutation(len(batches))]


def padding_waste(lengths: np.ndarray, batches: list[np.ndarray]) -> float:
    """The tokens of the padded batches over the real tokens (1.0: no padding)."""
    padded = sum(len(b) * int(lengths[b].max()) for b in batches if len(b))
    return padded / float(sum(int(lengths[b].sum()) for b in batches))


def pad(ids: list[np.ndarray], labels: np.ndarray, rows: np.ndarray, pad_id: int):
    """Rows ``rows`` as a batch: ids and mask padded to its longest text, and the labels."""
    import torch

    width = max(len(ids[i]) for i in rows)
    x = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for j, i in enumerate(rows):
        x[j, :len(ids[i])] = ids[i]
        mask[j, :len(ids[i])] = 1
    return torch.from_numpy(x), torch.from_numpy(mask), torch.from_numpy(labels[np.asarray(rows)])


# -- the network, the optimizer, the steps -----------------------------------------------------------------------
def network(pretrained: bool = True):
    from irbis.models.text_networks import text_source
    from irbis.train.text_finetune import TextFinetune

    return TextFinetune(text_source(BACKBONE), NUM_CLASSES, seed=SEED, pretrained=pretrained, dropout=DROPOUT)()


def adam_groups(model):
    """Adam with TextClassifier's two rates: the head (the network's last nn.Linear) at HEAD_LR, the encoder at
    HEAD_LR * BACKBONE_FACTOR."""
    import torch

    from irbis.train.finetune import head_name

    head = head_name(model.module if hasattr(model, "module") else model)
    named = [(n.removeprefix("module."), p) for n, p in model.named_parameters() if p.requires_grad]
    return torch.optim.Adam([{"params": [p for n, p in named if not n.startswith(head)],
                              "lr": HEAD_LR * BACKBONE_FACTOR},
                             {"params": [p for n, p in named if n.startswith(head)], "lr": HEAD_LR}], fused=True)


def plain_model():
    import torch

    torch.manual_seed(SEED)
    model = network().train()
    return model, adam_groups(model)


# -- (a) plain PyTorch -------------------------------------------------------------------------------------------
def plain_tune(data: str, steps: int, warm: int = 1) -> dict:
    """(a) on short runs: ``steps`` steps after ``warm`` untimed ones of epoch 0's shuffled and length-grouped
    batches, samples/s and the padding waste of the timed batches."""
    import torch

    torch.set_num_threads(2)
    texts, labels = read_data(data)
    ids, pad_id = token_ids(texts)
    lengths = np.array([len(r) for r in ids])
    passive = os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
    out = {}
    for grouped in (False, True):
        model, opt = plain_model()
        order = batch_order(lengths, GLOBAL_BATCH, 0, grouped)
        order = (order * (1 + (steps + warm) // len(order)))[:steps + warm]
        batches = (pad(ids, labels, b, pad_id) for b in order)
        ti.train_steps(model, opt, batches, False, warm)
        start = time.perf_counter()
        _, rows, _ = ti.train_steps(model, opt, batches, False, steps)
        out[_setting(grouped, passive)] = {"grouped": grouped, "passive": passive,
                                           "samples_per_s": rows / (time.perf_counter() - start),
                                           "waste": padding_waste(lengths, order[warm:])}
    return out


def plain_run(data: str, epochs: int, state_path: str, bf16: bool = False) -> dict:
    import torch

    start = ti.clock()
    torch.set_num_threads(2)
    texts, labels = read_data(data)
    ids, pad_id = token_ids(texts)
    lengths = np.array([len(r) for r in ids])
    model, opt = plain_model()
    curve = []
    t_loop = time.perf_counter()
    for epoch in range(epochs):
        batches = (pad(ids, labels, b, pad_id) for b in batch_order(lengths, GLOBAL_BATCH, epoch, True))
        loss_sum, rows, _ = ti.train_steps(model, opt, batches, False, bf16=bf16)
        curve.append({"epoch": epoch + 1, "loss": loss_sum / rows})
    end = time.perf_counter()
    torch.save(model.state_dict(), state_path)
    return {"seconds": end - start, "loop_seconds": end - t_loop, "samples": epochs * len(texts), "curve": curve}


# -- (b) TorchDistributor ----------------------------------------------------------------------------------------
class _Batches:
    """A DataLoader's dataset and batch sampler at once: item ``k`` of the sampler is this rank's rows of global
    batch ``k`` (every ``world``-th row of it), padded by the DataLoader's collate."""

    def __init__(self, ids: list[np.ndarray], labels: np.ndarray, order: list[np.ndarray], rank: int, world: int,
                 pad_id: int) -> None:
        self.ids, self.labels, self.pad_id = ids, labels, pad_id
        # a global batch too small to give every rank a row is left out (on every rank alike)
        self.batches = [b[rank::world] for b in order if len(b) >= world]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)

    def __getitem__(self, rows):
        return pad(self.ids, self.labels, rows, self.pad_id)


def td_train(data: str, epochs: int, workers: int, state_path: str, limit: int | None = None,
             warm: int = 1, bf16: bool = False) -> dict:
    """One DDP process of (b): a DataLoader over its half of every global batch, 8 rows a step."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    texts, labels = read_data(data)
    ids, pad_id = token_ids(texts)
    lengths = np.array([len(r) for r in ids])
    model, _ = plain_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = adam_groups(ddp)

    def epoch_batches(epoch: int):
        order = batch_order(lengths, GLOBAL_BATCH, epoch, True)
        if limit is not None:
            order = (order * (1 + (limit + warm) // len(order)))[:limit + warm]
        sampler = _Batches(ids, labels, order, rank, world, pad_id)
        return torch.utils.data.DataLoader(sampler, sampler=sampler, batch_size=None, num_workers=workers)

    return ti.ddp_loop(model, ddp, opt, epoch_batches, epochs, state_path, limit, warm, bf16=bf16)


def td_run(data: str, epochs: int, workers: int, state_path: str, limit: int | None = None, warm: int = 1,
           bf16: bool = False) -> dict:
    from pyspark.ml.torch.distributor import TorchDistributor

    from irbis.spark.session import get_spark

    get_spark("local[2]", app_name="irbis-train-text", **SPARK_CONF).sparkContext.setLogLevel("ERROR")
    n = len(read_data(data)[0])
    start = ti.clock()
    out = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
        td_train, data, epochs, workers, state_path, limit, warm, bf16)
    seconds = time.perf_counter() - start
    return {**out, "seconds": seconds, "samples": epochs * n}


# -- (c) Irbis on Spark ------------------------------------------------------------------------------------------
def spark_run(data: str, epochs: int, state_path: str, bf16: bool = False) -> dict:
    import pandas as pd

    from irbis.ml import TextClassifier
    from irbis.spark.session import get_spark

    spark = get_spark("local[2]", app_name="irbis-train-text", **SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    texts, labels = read_data(data)
    frame = pd.DataFrame({"text": texts, "label": labels})
    start = ti.clock()
    df = spark.createDataFrame(frame)
    clf = TextClassifier(backbone=BACKBONE, inputCol="text", labelCol="label", numClasses=NUM_CLASSES,
                         epochs=epochs, batchSize=GLOBAL_BATCH // 2, maxLength=MAX_LENGTH, numWorkers=2, seed=SEED,
                         learningRate=HEAD_LR, backboneLearningRateFactor=BACKBONE_FACTOR, showProgress=False,
                         **({"trainingPrecision": "bf16"} if bf16 else {}))
    model = clf.fit(df)
    seconds = time.perf_counter() - start
    results = clf.last_estimator.last_results
    Path(state_path).write_bytes(results[0].state)
    curve = [{k: v for k, v in r.items() if isinstance(v, (int, float, str)) or v is None}
             for r in model.training_summary]
    return {"seconds": seconds, "loop_seconds": max(r.loop_seconds for r in results),
            "samples": epochs * len(texts), "curve": curve}


# -- evaluation --------------------------------------------------------------------------------------------------
def accuracy(state_path: str, ids: list[np.ndarray], labels: np.ndarray, pad_id: int) -> float:
    """The final weights at ``state_path`` on the test reviews: eval mode, batches of 32 sorted by length."""
    import torch

    torch.set_num_threads(2)
    model = network(pretrained=False)
    model.load_state_dict(torch.load(io.BytesIO(Path(state_path).read_bytes()), weights_only=True))
    model.eval()
    order = np.argsort([len(r) for r in ids], kind="stable")
    pred = np.empty(len(ids), np.int64)
    with torch.inference_mode():
        for i in range(0, len(order), 32):
            rows = order[i:i + 32]
            x, mask, _ = pad(ids, labels, rows, pad_id)
            pred[rows] = model(x, mask).argmax(1).numpy()
    return float((pred == labels).mean())


# -- driver ------------------------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> dict:
    spec = json.loads(args.child)
    kind = spec.pop("kind")
    sampler = ti.SAMPLER = ti.MemorySampler({"plain": "plain", "plain_tune": "plain", "td": "td"}.get(kind, "spark"))
    sampler.start()
    run = {"plain": plain_run, "plain_tune": plain_tune, "td": td_run, "spark": spark_run}[kind]
    try:
        out = run(**spec)
    except Exception as err:  # reported by the parent: (c) as "not available", (a) and (b) as a failure
        return {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"}
    return {"result": out, "memory": sampler.stop()}


def spawn(kind: str, passive: bool = False, **spec) -> dict:
    out = ti.spawn(kind, passive, script=__file__, **spec)
    if "error" in out and kind != "spark":
        raise RuntimeError(f"{kind} {spec}: {out['error']}")
    return out


def _epochs(n: int) -> str:
    return f"{n} epoch" + ("s" if n != 1 else "")


def _setting(grouped: bool, passive: bool) -> str:
    return ("length-grouped" if grouped else "shuffled") + (", OMP_WAIT_POLICY=PASSIVE" if passive else "")


def run_all(root: Path, rows: int | None, repeats: int, epochs: int, quick: bool) -> tuple[list[str], dict]:
    paths = write_data(root, rows, repeats)
    texts, labels = read_data(paths["train"])
    test_texts, test_labels = read_data(paths["test"])
    ids, pad_id = token_ids(texts)
    test_ids, _ = token_ids(test_texts)
    lengths = np.array([len(r) for r in ids])
    print(f"{len(texts)} training reviews ({labels.mean():.2f} positive, {lengths.mean():.0f} tokens on average), "
          f"{len(test_texts)} test reviews; {_epochs(epochs)}", flush=True)
    state = str(root / "state.pt")
    steps, warm = (1, 1) if quick else (TUNE_STEPS, 1)

    def row(label: str, kind: str, **spec) -> dict:
        before = os.getloadavg()[0]
        out = spawn(kind, **spec)
        r = {"label": label, "load": (before, os.getloadavg()[0])}
        if "error" in out:
            r["error"] = out["error"]
            print(f"{label[:3]} not available: {out['error']}", flush=True)
            return r
        res = out["result"]
        r.update(seconds=res["seconds"], samples=res["samples"], e2e=res["samples"] / res["seconds"],
                 loop=res["samples"] / res["loop_seconds"], loop_seconds=res["loop_seconds"],
                 acc=accuracy(state, test_ids, test_labels, pad_id), memory=out["memory"], curve=res["curve"])
        print(table([r])[-1], flush=True)
        return r

    tune_a = {k: v for passive in (False, True) for k, v in spawn(
        "plain_tune", passive=passive, data=paths["train"], steps=steps, warm=warm)["result"].items()}
    print("(a) tuning:", {k: round(v["samples_per_s"], 1) for k, v in tune_a.items()}, flush=True)
    best_a = max((v for v in tune_a.values() if v["grouped"]), key=lambda r: r["samples_per_s"])
    tune_b = {}
    for workers in (0, 1):
        out = spawn("td", data=paths["train"], epochs=1, workers=workers, state_path=state, limit=steps, warm=warm)
        tune_b[f"DataLoader num_workers={workers}"] = {"workers": workers,
                                                       "samples_per_s": out["result"]["tune_per_s"]}
    print("(b) tuning:", {k: round(v["samples_per_s"], 1) for k, v in tune_b.items()}, flush=True)
    best_b = max(tune_b.values(), key=lambda r: r["samples_per_s"])
    tables = {}
    for key, data, n_epochs in (("one", paths["train"], epochs), ("grown", paths["grown"], 1)):
        tables[key] = [
            row("(a) plain PyTorch, 1 process x 2 threads", "plain", passive=best_a["passive"], data=data,
                epochs=n_epochs, state_path=state),
            row("(b) TorchDistributor DDP, 2 processes x 1", "td", data=data, epochs=n_epochs,
                workers=best_b["workers"], state_path=state),
            row("(c) TextClassifier, numWorkers=2", "spark", data=data, epochs=n_epochs, state_path=state)]
    from irbis.train.loop import bf16_emulated

    if not bf16_emulated("cpu"):  # each side's steps under bf16 autocast, at the settings tuned in fp32
        tables["bf16"] = [
            row("(a) plain PyTorch, bf16 autocast", "plain", passive=best_a["passive"], data=paths["grown"],
                epochs=1, state_path=state, bf16=True),
            row("(b) TorchDistributor DDP, bf16 autocast", "td", data=paths["grown"], epochs=1,
                workers=best_b["workers"], state_path=state, bf16=True),
            row("(c) TextClassifier, trainingPrecision=bf16", "spark", data=paths["grown"], epochs=1,
                state_path=state, bf16=True)]
    waste = {name: padding_waste(lengths, [b for e in range(epochs) for b in batch_order(lengths, GLOBAL_BATCH, e, g)])
             for name, g in (("shuffled", False), ("length-grouped", True))}
    return report(tables, tune_a, tune_b, best_a, best_b, waste, dict(
        n_train=len(texts), n_test=len(test_texts), positive=float(labels.mean()),
        test_positive=float(test_labels.mean()), mean_tokens=float(lengths.mean()), max_tokens=int(lengths.max()),
        epochs=epochs, repeats=repeats, steps=steps, warm=warm))


def table(rows: list[dict]) -> list[str]:
    a = next((r for r in rows if r["label"].startswith("(a)") and "error" not in r), None)
    b = next((r for r in rows if r["label"].startswith("(b)") and "error" not in r), None)
    head = (f"{'row':41s} {'samples/s e2e':>13s} {'vs (a)':>6s} {'vs (b)':>6s} {'loop':>6s} {'vs (a)':>6s} "
            f"{'vs (b)':>6s} {'CPU ms/sample':>13s} {'test acc':>8s} {'RSS peak MiB':>12s} {'largest MiB':>11s} "
            f"{'e2e s':>6s} {'load':>9s}")
    out = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            out.append(f"{r['label']:41s} not available: {r['error']}")
            continue
        cpu = 1e3 * r["memory"]["cpu_seconds"] / r["samples"]
        out.append(f"{r['label']:41s} {r['e2e']:13.1f} {ti.fmt_ratio(r['e2e'], a and a['e2e']):>6s} "
                   f"{ti.fmt_ratio(r['e2e'], b and b['e2e']):>6s} {r['loop']:6.1f} "
                   f"{ti.fmt_ratio(r['loop'], a and a['loop']):>6s} {ti.fmt_ratio(r['loop'], b and b['loop']):>6s} "
                   f"{cpu:13.0f} {r['acc']:8.4f} {r['memory']['peak_sum_mib']:12.0f} "
                   f"{r['memory']['largest_mib']:11.0f} {r['seconds']:6.1f} {r['load'][0]:4.1f}-{r['load'][1]:<4.1f}")
    return out


def report(tables: dict, tune_a: dict, tune_b: dict, best_a: dict, best_b: dict, waste: dict,
           run: dict) -> tuple[list[str], dict]:
    n_train, repeats, epochs = run["n_train"], run["repeats"], run["epochs"]
    shuffled = {v["passive"]: v for v in tune_a.values() if not v["grouped"]}[best_a["passive"]]
    accs = [r["acc"] for rows in tables.values() for r in rows if "acc" in r]
    mean = float(np.mean(accs)) if accs else 0.5
    se = float(np.sqrt(max(mean * (1 - mean), 1e-9) / run["n_test"]))
    lines = [
        f"data: the UCI drug reviews (irbis.demo.reviews.drug_reviews), label 1 for a positive rating (7 or more): "
        f"{n_train} training reviews ({100 * run['positive']:.1f}% positive; {run['mean_tokens']:.1f} tokens on "
        f"average, up to {run['max_tokens']} at maxLength {MAX_LENGTH}), {run['n_test']} held-out test reviews "
        f"({100 * run['test_positive']:.1f}% positive)",
        f"same work on every row: {BACKBONE} pretrained (BertForSequenceClassification, irbis.train.text_finetune."
        f"TextFinetune), a new 2-class head (seed {SEED}, dropout {DROPOUT}), every layer trained; Adam, head "
        f"{HEAD_LR:g}, encoder {HEAD_LR * BACKBONE_FACTOR:g}; maxLength {MAX_LENGTH}, each batch padded to its "
        f"longest text; global batch {GLOBAL_BATCH} (1 x {GLOBAL_BATCH} or 2 x {GLOBAL_BATCH // 2})",
        f"Spark: local[2] (one torch thread per task), get_spark defaults + {SPARK_CONF}; every row in a fresh "
        "process (and Spark session), one after the other",
        "(b) all-reduces every gradient whole (DDP); (c)'s sync sends of the 30522-row word embedding table only the "
        "rows some worker's batch touched (irbis.train.strategy.all_reduce_mean): the same mean",
        "",
        f"(a) tuned on {run['steps']} steps after {run['warm']} untimed, samples/s (padding waste of the timed "
        "batches): " + "; ".join(f"{k} {v['samples_per_s']:.1f} ({v['waste']:.2f})" for k, v in tune_a.items())
        + f"  -> {_setting(True, best_a['passive'])}",
        f"(b) tuned on {run['steps']} steps after {run['warm']} untimed, length-grouped global batches, samples/s: "
        + "; ".join(f"{k} {v['samples_per_s']:.1f}" for k, v in tune_b.items())
        + f"  -> DataLoader num_workers={best_b['workers']}",
        "",
        f"length grouping in the plain loop (a), chunks of {GROUP_CHUNK} batches: padding waste over "
        f"the batches of {_epochs(epochs)}: {waste['length-grouped']:.2f}, plain shuffled batches "
        f"{waste['shuffled']:.2f} (goal: 1.10 or less); speed {best_a['samples_per_s']:.1f} against "
        f"{shuffled['samples_per_s']:.1f} samples/s, "
        f"{ti.fmt_ratio(best_a['samples_per_s'], shuffled['samples_per_s'])} (goal: 1.3x or more)",
        "",
        f"## {n_train} training reviews, {_epochs(epochs)}",
        "", *table(tables["one"]), "",
        f"## the training reviews repeated {repeats}x ({repeats * n_train} reviews), 1 epoch",
        "", *table(tables["grown"]), "",
        *bf16_section(tables, repeats),
        f"test acc: one held-out review is {100 / run['n_test']:.2f} points; binomial standard error about "
        f"{100 * se:.1f} points",
        "samples/s e2e: training samples (reviews x epochs) over the whole call (for (a) tokenizing included, for "
        "(c) from making the DataFrame to the fitted model); loop: over the training loop alone (for (c) the "
        "slowest worker's loop_seconds); vs (a), vs (b): over (a)'s or (b)'s rate in the same table.",
        "CPU ms/sample: user + system CPU time of every process of the row (for (c) the driver, the JVM and the "
        "Python workers; for (b) the driver, torchrun and the DDP processes) over the same span as e2e, per training "
        "sample. load: the 1-minute load average when the row started and ended.",
        "RSS peak: the peak of the summed RSS of the processes that train (sampled every 0.25 s: (a) the process, "
        "(b) the DDP processes and their DataLoader workers, (c) the Spark Python workers); largest: the largest "
        "single process's peak (VmHWM).",
        "test acc: each row's final weights on the held-out reviews, scored by one function (the same tokens, eval "
        "mode).",
    ]
    return lines, {"tables": tables, "tune_a": tune_a, "tune_b": tune_b, "waste": waste, **run}


def bf16_section(tables: dict, repeats: int) -> list[str]:
    """The bf16 table (the grown data, each side under bf16 autocast) with each side's speed over its fp32 row."""
    if "bf16" not in tables:
        return ["## bf16 autocast: not run (this CPU has no bf16 instructions)", ""]
    fp32 = {r["label"][:3]: r for r in tables["grown"] if "error" not in r}
    gains = "; ".join(f"{r['label'][:3]} {ti.fmt_ratio(r['e2e'], fp32[r['label'][:3]]['e2e'])} e2e, "
                      f"{ti.fmt_ratio(r['loop'], fp32[r['label'][:3]]['loop'])} loop"
                      for r in tables["bf16"] if "error" not in r and r["label"][:3] in fp32)
    return [f"## bf16 autocast: the same {repeats}x rows with each side's forward pass and loss under "
            "torch.autocast('cpu', bfloat16)",
            "weights, gradients, Adam and the exchange in fp32 on every side; (a) and (b) at the settings tuned in "
            "fp32; (c) with trainingPrecision='bf16'",
            "", *table(tables["bf16"]), "",
            f"over the same side's fp32 row above: {gains}", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_ROWS} training and test reviews, 1 epoch, data grown {QUICK_REPEATS}x; "
                             "nothing written")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    rows, repeats = (QUICK_ROWS, QUICK_REPEATS) if args.quick else (None, REPEATS)
    epochs = args.epochs or (QUICK_EPOCHS if args.quick else EPOCHS)
    run = Run(__file__, packages=PACKAGES)
    root = Path(tempfile.mkdtemp(prefix="irbis-bench-train-text-"))
    try:
        report_lines, payload = run_all(root, rows, repeats, epochs, args.quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    header = run.header()
    text = "\n".join([*header, "", *report_lines]) + "\n"
    print(text)
    if args.quick:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "train_text.txt").write_text(text)
    (RESULTS / "train_text.json").write_text(json.dumps({"provenance": header, **payload}, indent=1))


if __name__ == "__main__":
    main()
