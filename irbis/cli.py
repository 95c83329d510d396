"""The ``irbis`` command line: ``irbis demo | featurize | train | classify | photos | explain | serve | models``."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from irbis.kernels.engines import ENGINE_NAMES

_ROLE = re.compile(r":[\w.:-]+:`~?([^`<]*?)\s*(?:<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`")


def plain_text(text: str) -> str:
    """``text`` without reStructuredText markup: ``:role:`~a.b.c``` gives ``c`` (``a.b.c`` without the
    tilde), double and single backquotes go, their text stays.

    Examples
    --------
    >>> plain_text("The ``irbis`` command: :func:`~irbis.spark.session.get_spark`, :data:`STRATEGIES`")
    'The irbis command: get_spark, STRATEGIES'
    """
    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        return target.rsplit(".", 1)[-1] if match.group(0).split("`", 1)[1].startswith("~") else target

    return _LITERAL.sub(lambda m: m.group(1) or m.group(2), _ROLE.sub(role, text))


class _PlainFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help text as a terminal shows it: the docstrings' reStructuredText markup taken out, and each option's
    default (unless it has none, is a switch, or its help already says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.default is None or action.default is False or action.default == argparse.SUPPRESS
                or "default" in text or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        build = getattr(action, "build_help", None)
        if build is not None:  # help from a registry that needs torch, read when shown
            action.help, action.build_help = build(), None
        return plain_text(super()._expand_help(action))


class _Parser(argparse.ArgumentParser):
    """An argument parser whose help is plain text; its sub-command parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _PlainFormatter)
        super().__init__(*args, **kwargs)


def _names(values: Any) -> str:
    return ", ".join(values)


class _Lazy:
    """The names of a registry, read when first asked for (to check a value, or for help), so that a command
    whose registry needs torch does not import it for ``irbis --help`` or another command."""

    def __init__(self, load: Any) -> None:
        self._load, self._names = load, None

    def _get(self) -> list[str]:
        if self._names is None:
            self._names = list(self._load())
        return self._names

    def __iter__(self) -> Any:
        return iter(self._get())

    def __contains__(self, value: object) -> bool:
        return value in self._get()

    def __len__(self) -> int:
        return len(self._get())


def _help_later(action: argparse.Action, build: Any) -> None:
    """Give ``action`` the help text ``build()``, built when the help is shown (see :class:`_PlainFormatter`)."""
    action.build_help = build  # type: ignore[attr-defined]


def _strategies() -> Any:
    from irbis.train.strategies import STRATEGIES

    return STRATEGIES


def _lr_scalings() -> Any:
    from irbis.train.optim import LR_SCALINGS

    return LR_SCALINGS


def _training_precisions() -> Any:
    from irbis.train.loop import TRAINING_PRECISIONS

    return TRAINING_PRECISIONS


def _all_models() -> list[str]:
    from irbis.models import MODELS

    return sorted(MODELS)


def _model_option(parser: argparse.ArgumentParser, flag: str, what: str, num_classes: int | None = None,
                  old: str | None = None) -> None:
    """``flag``: a name of :func:`_image_models`, ``efficientnet_lite0`` by default; ``old``, a flag name
    still taken but not shown."""
    def names() -> list[str]:
        return _image_models(num_classes)

    action = parser.add_argument(flag, default="efficientnet_lite0", choices=_Lazy(names), metavar="NETWORK",
                                 help=what)
    _help_later(action, lambda: f"{what} (irbis.models.MODELS): {_names(names())} (default: efficientnet_lite0)")
    if old:
        parser.add_argument(old, dest=action.dest, choices=action.choices, metavar="NETWORK", help=argparse.SUPPRESS)


def _master_option(parser: argparse.ArgumentParser) -> None:
    """``--master``, the Spark master URL of every command, :data:`~irbis.spark.session.DEFAULT_MASTER` by
    default."""
    from irbis.spark.session import DEFAULT_MASTER

    parser.add_argument("--master", default=DEFAULT_MASTER, help="Spark master URL")


def _stage_defaults(param: str) -> str:
    """``train``'s help for a flag whose default is the stage's: ``param``'s default on ImageClassifier
    (``--task image``) and TorchEstimator (``--task vectors``)."""
    from irbis.ml import ImageClassifier, TorchEstimator

    image, vectors = (stage().getOrDefault(param) for stage in (ImageClassifier, TorchEstimator))
    if image == vectors:
        return f"the stages' {param}, {image}"
    return f"the stage's {param}: ImageClassifier's {image} (--task image), TorchEstimator's {vectors} (--task vectors)"


#: ``irbis train``'s flags that set a Param of the task's stage (ImageClassifier or TorchEstimator) when given,
#: else leave the stage's default: flag dest -> Param.
TRAIN_PARAMS = {"epochs": "epochs", "batch_size": "batchSize", "workers": "numWorkers", "strategy": "strategy",
                "strategy_options": "strategyOptions", "optimizer": "optimizer", "learning_rate": "learningRate",
                "validation_fraction": "validationFraction", "lr_scaling": "lrScaling",
                "training_precision": "trainingPrecision",
                "checkpoint_dir": "checkpointDir", "augmentation": "augmentation"}


def _train_params(args: argparse.Namespace) -> dict[str, Any]:
    """The Params ``irbis train``'s flags set (those given on the command line)."""
    return {param: getattr(args, dest) for dest, param in TRAIN_PARAMS.items() if getattr(args, dest) is not None}


def _architectures_help() -> str:
    from irbis.models.architectures import ARCHITECTURES

    return (f"an architecture (irbis.models.ARCHITECTURES: {_names(ARCHITECTURES)}), a TorchScript file, or "
            "'package.module:function'")


def _optimizers_help() -> str:
    from irbis.train.optim import OPTIMIZERS

    return f"{_names(OPTIMIZERS)}, or 'package.module:function' (params -> torch.optim.Optimizer)"


def _strategy_help() -> str:
    """The strategies of :data:`irbis.train.strategies.STRATEGIES`, synchronous and parameter-server."""
    STRATEGIES = _strategies()
    sync = [name for name, cls in STRATEGIES.items() if not cls.owns_update]
    server = [name for name, cls in STRATEGIES.items() if cls.owns_update]
    return (f"data-parallel strategy (irbis.train.strategies.STRATEGIES): {_names(sync)} (synchronous); "
            f"{_names(server)} (parameter server)")


def _image_models(num_classes: int | None = None) -> list[str]:
    """The models of the registry (irbis.models.MODELS) with a preprocessing record, those that read images;
    with ``num_classes``, only those with that many classes."""
    from irbis.models import MODELS

    return sorted(name for name, entry in MODELS.items() if entry.preprocessing is not None
                  and num_classes in (None, entry.num_classes))


def _cmd_models(args: argparse.Namespace) -> int:
    from irbis.models import ModelRepository

    if args.action == "check":
        return _cmd_models_check(args)
    repo = ModelRepository(catalogue=args.catalogue)
    for entry in repo.entries():
        weights = "weights shipped" if entry.uri else "architecture only"
        print(f"{entry.name:24s} {entry.architecture:20s} input {list(entry.input_shape)}  {weights}  "
              f"feature layers {list(entry.layers)}")
    return 0


def _cmd_models_check(args: argparse.Namespace) -> int:
    from irbis.demo.photos import check_precision

    if not args.name:
        print("irbis models check: name a model, e.g. irbis models check efficientnet_lite0 --precision bf16")
        return 2
    r = check_precision(args.name, args.precision, engine=args.engine)
    print(f"{args.name} precision={args.precision} engine={args.engine}: top-1 agreement with eager fp32 "
          f"{r['agreement']:.3f} on {r['crops']} real-photo crops; {r['images_per_s']:.1f} images/s "
          f"(eager fp32 {r['fp32_images_per_s']:.1f}, {r['images_per_s'] / r['fp32_images_per_s']:.2f}x)")
    if not r["keeps_answers"]:
        from irbis.demo.photos import AGREEMENT_GOAL

        print(f"  below the {AGREEMENT_GOAL:.2f} agreement that keeps the answers: {r['changed']} of {r['crops']} "
              f"crops change class; use fp32, or bf16 where it keeps them")
    return 0


def _cmd_classify(args: argparse.Namespace) -> int:
    from irbis.demo.photos import classify_photos

    table = classify_photos(args.images, model=args.network, precision=args.precision, master=args.master,
                            top=args.top)
    for path, labels in table:
        print(path)
        for name, prob in labels:
            print(f"    {prob:6.3f}  {name}")
    return 0


def _cmd_featurize(args: argparse.Namespace) -> int:
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import ImageReadStats, read_images
    from irbis.spark.session import get_spark

    spark = get_spark(args.master, app_name="irbis-featurize")
    stats = ImageReadStats(spark)
    images = read_images(args.images, dropInvalid=True, spark=spark, stats=stats,
                         pathGlobFilter=args.glob)
    featurizer = ImageFeaturizer(inputCol="image", outputCol="features", network=args.network,
                                 cutOutputLayers=args.cut, precision=args.precision)
    out = _vectors_as(featurizer.transform(images).select("path", "features"), "features", args.vectors)
    out.write.mode(args.mode).parquet(args.output)
    print(f"features of {stats.files - stats.bad_files} images written to {args.output}; "
          f"{stats.bad_files} files could not be decoded and were skipped")
    return 0


def _vectors_as(frame: Any, column: str, kind: str) -> Any:
    """``frame`` with its Spark ML vector ``column`` as ``array<float>`` (``kind`` "array": what pandas, DuckDB,
    Polars and vector stores read as a list of float32), or as it is (``kind`` "ml": Spark ML's vector, which
    they see as a struct of type, size, indices and values)."""
    if kind == "ml":
        return frame
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    # a row without a vector (a text that is not UTF-8) stays null: vector_to_array refuses a null input
    return frame.withColumn(column, F.when(F.col(column).isNotNull(), vector_to_array(F.col(column), "float32")))


def _text_frame(spark: Any, source: str, column: str) -> Any:
    """The texts of ``source``: a Parquet or CSV file (or folder of them) with a ``column``, or a folder of
    ``.txt`` files (one text per file, with its ``path``)."""
    lower = source.rstrip("/").lower()
    if lower.endswith(".parquet"):
        frame = spark.read.parquet(source)
    elif lower.endswith(".csv"):
        frame = (spark.read.option("header", True).option("multiLine", True).option("escape", '"')
                 .option("inferSchema", True).csv(source))  # an integer id column stays an integer
    else:
        frame = (spark.read.format("binaryFile").option("pathGlobFilter", "*.txt").load(source)
                 .selectExpr("path", f"content as `{column}`"))  # bytes: a file that is not UTF-8 is named
    if column not in frame.columns:
        raise ValueError(f"{source} has no column {column!r} (its columns: {', '.join(frame.columns)}); "
                         "name the text column with --column")
    return frame


def _cmd_embed(args: argparse.Namespace) -> int:
    from irbis.ml.text_network import TextEmbedder
    from irbis.spark.session import get_spark

    spark = get_spark(args.master, app_name="irbis-embed")
    texts = _text_frame(spark, args.texts, args.column)
    embedder = TextEmbedder(network=args.network, inputCol=args.column, outputCol="embedding",
                            precision=args.precision, maxLength=args.max_length, errorCol="error")
    out = _vectors_as(embedder.transform(texts).drop(args.column), "embedding", args.vectors)
    out.write.mode(args.mode).parquet(args.output)
    written = spark.read.parquet(args.output)
    failed = written.where("embedding is null").count()
    print(f"embeddings of {written.count() - failed} texts written to {args.output}; {failed} rows have none "
          "(their reason is in the column error)")
    return 0


def _image_folder_frame(spark: Any, folder: str) -> tuple[Any, list[str]]:
    """Image files with labels, from ``metadata.csv`` (columns ``path`` relative to the folder, ``label``) or
    from sub-folders (``<label>/.../<image>``): a ``binaryFile`` frame with an integer ``label`` column (the
    class names sorted), and the class names."""
    import pandas as pd


    root = Path(folder).resolve()
    csv = root / "metadata.csv"
    if csv.is_file():
        meta = pd.read_csv(csv, dtype=str, keep_default_na=False)
        if not {"path", "label"} <= set(meta.columns):
            raise SystemExit(f"irbis train: {csv} needs columns path and label; found {list(meta.columns)}")
        meta["path"] = [str((root / p).resolve()) for p in meta["path"]]
    else:
        files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
                 and p.parent != root]
        meta = pd.DataFrame({"path": [str(p) for p in files], "label": [p.relative_to(root).parts[0] for p in files]})
    if meta.empty:
        raise SystemExit(f"irbis train: no images in {root}; put them in <label>/ sub-folders or list them in "
                         "metadata.csv (path, label)")
    names = sorted(meta["label"].unique())
    index = {n: i for i, n in enumerate(names)}
    labels = spark.createDataFrame(pd.DataFrame({"path": ["file:" + p for p in meta["path"]],
                                                 "label": [index[n] for n in meta["label"]]}))
    files = spark.read.format("binaryFile").load([f"file:{p}" for p in meta["path"]]).select("path", "content")
    return files.join(labels, "path"), names


#: Image file suffixes that ``irbis train`` picks up from a folder.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
#: Where `irbis demo` writes its report by default (`--text`: its text folder).
DEMO_OUTPUT = "irbis-demo-output"


def _train_images(args: argparse.Namespace, spark: Any) -> int:
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import IndexToString

    from irbis.ml import ImageClassifier

    data, names = _image_folder_frame(spark, args.data)
    clf = ImageClassifier(backbone=args.backbone, imageCol="content", numClasses=max(2, len(names)),
                          freezeUntil=args.freeze_until, **_train_params(args))
    model = clf.fit(data)
    pipeline = PipelineModel([model, IndexToString(inputCol="prediction", outputCol="predictedLabel", labels=names)])
    pipeline.write().overwrite().save(args.output)
    for record in model.training_summary or []:
        print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))
    print(f"fitted PipelineModel (ImageClassifierModel, IndexToString over {names}) saved to {args.output}")
    return 0


def _batch_size(text: str) -> int | str:
    """``--batch-size``: ``auto`` or a positive integer, checked as the ``batchSize`` Param checks it."""
    from irbis.ml.estimator import check_batch_size, to_batch_size

    try:
        number: int | str = int(text)
    except ValueError:
        number = text  # "auto", or refused by the converter below
    try:
        value = to_batch_size(number)
        check_batch_size("batchSize", value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _cmd_train(args: argparse.Namespace) -> int:
    from irbis.ml import TorchEstimator
    from irbis.spark.session import get_spark

    spark = get_spark(args.master, app_name="irbis-train")
    if args.task == "image":
        return _train_images(args, spark)
    if args.freeze_until:
        raise ValueError("--freeze-until is a flag of --task image (ImageClassifier); --task vectors trains "
                         "--network on a parquet of features")
    data = spark.read.parquet(args.data)
    estimator = TorchEstimator(network=args.network, networkOptions=args.network_options,
                               inputCol=args.features_col, labelCol=args.label_col, **_train_params(args))
    model = estimator.fit(data)
    model.write().overwrite().save(args.output)
    for record in model.training_summary or []:
        print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))
    print(f"fitted TorchModel saved to {args.output}")
    return 0


def _cmd_pack(args: argparse.Namespace) -> int:
    from irbis.spark.environment import pack

    packed = pack(args.output, compress=not args.no_compress)
    print(f"{packed.path}: {packed.bytes / 2**20:.0f} MiB, built in {packed.seconds:.0f} s; executors need "
          f"Python {packed.python}. Ship it with irbis.get_spark(master, environment={str(packed.path)!r})")
    return 0


def _cmd_photos(args: argparse.Namespace) -> int:
    from irbis.demo.photos import classify_photos, write_sample_photos

    folder = write_sample_photos(args.output)
    print(f"Scoring the sample photographs in {folder} with EfficientNet-Lite0 on Spark {args.master}")
    for path, labels in classify_photos(str(folder), precision=args.precision, master=args.master, top=3):
        print(f"{path.split('/')[-1]:16s} " + ", ".join(f"{n} ({p:.2f})" for n, p in labels))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import time

    from irbis.demo.camera_trap import run_demo
    from irbis.demo.data import check_size
    from irbis.demo.dataset import check_labels, load_metadata
    from irbis.spark.session import get_spark, is_connect

    if args.text:
        return _demo_text(args)
    check_size(args.size)  # check the input before starting Spark: bad input fails in a second
    if args.images:
        check_labels(load_metadata(args.images), args.positive)
    start = time.perf_counter()
    spark = get_spark(args.master, app_name="irbis-demo", **{"spark.ui.showConsoleProgress": "false"})
    if not is_connect(spark):  # a Connect server keeps its own log level
        spark.sparkContext.setLogLevel("ERROR")
    result = run_demo(spark, args.output, args.images, size=args.size, positive=args.positive,
                      precision=args.precision, seed=args.seed, explain=args.explain,
                      progress=not args.no_progress, fine_tune=args.fine_tune)
    print(result.table)
    print(f"best: {result.best}; report {result.output / 'report.html'}, pipeline {result.output / 'model'}")
    print(f"wall time {time.perf_counter() - start:.0f} s")
    return 0


def _demo_text(args: argparse.Namespace) -> int:
    import time

    from irbis.demo.text_demo import check_options, run_text_demo
    from irbis.spark.session import get_spark, is_connect

    rungs = check_options([r.strip() for r in args.rungs.split(",")] if args.rungs else None, args.sample,
                          args.folds)
    start = time.perf_counter()
    spark = get_spark(args.master, app_name="irbis-demo-text", **{"spark.ui.showConsoleProgress": "false"})
    if not is_connect(spark):
        spark.sparkContext.setLogLevel("ERROR")
    output = args.output if args.output != DEMO_OUTPUT else f"{DEMO_OUTPUT}/text"
    result = run_text_demo(spark, output, rungs=rungs, folds=args.folds, seed=args.seed, sample=args.sample,
                           progress=not args.no_progress)
    print(result.table)
    print(f"report {result.output / 'report.html'}")
    print(f"wall time {time.perf_counter() - start:.0f} s")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    import numpy as np
    from pyspark.ml import PipelineModel

    from irbis.explain.page import ExplainedImage, write_explanation_page
    from irbis.kernels.image.decode import struct_to_array
    from irbis.ml.lime import ImageLIME
    from irbis.spark.images import read_images
    from irbis.spark.session import get_spark

    spark = get_spark(args.master, app_name="irbis-explain")
    model = PipelineModel.load(args.pipeline)
    column = _explained_text_column(model, args)
    if column is not None:
        return _explain_texts(spark, model, column, args)
    if not args.source:
        raise SystemExit("irbis explain: name a folder of images (the pipeline reads images)")
    images = read_images(args.source, spark=spark, pathGlobFilter=args.glob)
    lime = ImageLIME(model=model, inputCol="image", targetCol=args.target_col,
                     targetClasses=[args.target_class], numSamples=args.samples, cellSize=args.cell_size)
    items = []
    for row in lime.transform(images).orderBy("path").toLocalIterator():
        ok = row.weights is not None
        items.append(ExplainedImage(
            row.path.split("/")[-1], struct_to_array(row.image) if ok else None,
            np.array(row.superpixels) if ok else None, np.array(row.weights[0]) if ok else None,
            row.r2[0] if ok else None, row.explainError or row.error))
    page = write_explanation_page(args.output, items, top=args.top)
    print(f"explained {sum(i.weights is not None for i in items)} of {len(items)} images; see {page}")
    return 0


def _explained_text_column(model: Any, args: argparse.Namespace) -> str | None:
    """The text column ``irbis explain`` perturbs (``--column``, else the pipeline's one text input), or ``None``
    for a pipeline that reads images."""
    from irbis.ml.kernel_pipeline import model_chain

    inputs = model_chain(model).inputs
    if any("image" in kinds for kinds in inputs.values()) and not args.text:
        return None
    texts = [c for c, kinds in inputs.items() if "string" in kinds]
    if args.column:
        return args.column
    if len(texts) != 1:
        raise SystemExit(f"irbis explain: the pipeline reads {list(inputs)}; name its text column with --column")
    return texts[0]


def _explain_texts(spark: Any, model: Any, column: str, args: argparse.Namespace) -> int:
    """``irbis explain`` of a text pipeline: TextLIME's word weights of ``--text`` texts or of the first ``--rows``
    texts of a file, written as a page (see :func:`irbis.explain.page.write_text_explanation_page`)."""
    import numpy as np

    from irbis.explain.page import ExplainedText, write_text_explanation_page
    from irbis.ml.lime_text import TextLIME

    if bool(args.text) == bool(args.source):
        raise SystemExit("irbis explain: give either texts (--text, repeatable) or a Parquet/CSV file or folder of "
                         ".txt files, not both and not neither")
    if args.text:
        frame = spark.createDataFrame([(f"text {i + 1}", t) for i, t in enumerate(args.text)],
                                      f"name string, `{column}` string")
    else:
        frame = _text_frame(spark, args.source, column)
        frame = (frame.orderBy("path") if "path" in frame.columns else frame).limit(args.rows)
        names = "path" if "path" in frame.columns else None
        frame = frame.selectExpr(f"{'`' + names + '`' if names else 'null'} as name", f"`{column}`")
    lime = TextLIME(model=model, inputCol=column, targetCol=args.target_col, targetClasses=[args.target_class],
                    numSamples=args.samples, tokensCol="", errorCol="explainError")
    items = []
    for i, row in enumerate(lime.transform(frame).toLocalIterator()):
        name = row.name.rsplit("/", 1)[-1] if row.name else f"row {i + 1}"
        ok = row.weights is not None
        text = row[column]
        text = text.decode("utf-8", "replace") if isinstance(text, (bytes, bytearray)) else text
        items.append(ExplainedText(name, text, np.array(row.weights[0]) if ok else None,
                                   row.r2[0] if ok else None, row.explainError))
    page = write_text_explanation_page(args.output, items, top=args.top)
    print(f"explained {sum(i.weights is not None for i in items)} of {len(items)} texts; see {page}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from irbis.serving.app import ServeOptions

    options = ServeOptions(max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                           max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                           timeout_s=args.timeout, token=args.token, length_groups=args.length_groups)
    outputs = [c for c in args.outputs.split(",") if c] if args.outputs else None
    if args.replicas:
        from irbis.serving.replicas import serve_on_spark

        if not args.master:
            raise ValueError("--replicas needs --master MASTER: the replicas run on its executors")
        serve_on_spark(args.pipeline, args.master, args.replicas, host=args.host, port=args.port, outputs=outputs,
                       options=options, addresses_file=args.addresses_file)
        return 0
    from irbis.serving.server import serve

    print(f"serving {args.pipeline} on http://{args.host}:{args.port} (POST /predict; GET /health, /ready, "
          f"/metrics, /openapi.json)", flush=True)
    serve(args.pipeline, host=args.host, port=args.port, workers=args.processes, outputs=outputs,
          spark=args.master, options=options)
    return 0


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve a saved pipeline over HTTP (its kernels, no Spark job per request)",
                           description="Serve a saved PipelineModel (or one saved stage) over HTTP: POST /predict "
                           "takes a JSON object or array of objects keyed by the input columns (or image bytes), "
                           "and answers with the last stage's output columns (--outputs to choose). A body over "
                           "--max-body-bytes gets a 413 that the client reads even while it is still sending.")
    serve.add_argument("pipeline", help="folder of a saved PipelineModel or stage")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    serve.add_argument("--port", type=int, default=8080, help="with --replicas, 0 picks a free port per replica")
    serve.add_argument("--processes", type=int, default=1,
                       help="server processes (default 1, whose network takes every core; N: cores // N each)")
    serve.add_argument("--workers", type=int, dest="processes", help=argparse.SUPPRESS)  # the old name
    serve.add_argument("--outputs", default=None, metavar="COLUMNS|all",
                       help="comma-separated output columns to answer with, or 'all' for every column the "
                       "pipeline writes (default: the last stage's output columns, e.g. a classifier's "
                       "rawPrediction, probability and prediction)")
    serve.add_argument("--token", default=None, help="bearer token for /predict (default: $IRBIS_SERVE_TOKEN)")
    serve.add_argument("--master", default=None, help="Spark master URL: serve stages without a kernel through "
                       "a Spark session on it (slower); with --replicas, the cluster to run on (default: none, no "
                       "Spark)")
    serve.add_argument("--spark", dest="master", help=argparse.SUPPRESS)  # the old name
    serve.add_argument("--replicas", type=int, default=0, help="servers to run on the --master executors")
    serve.add_argument("--addresses-file", default="irbis-serve-addresses.txt",
                       help="with --replicas: where the replicas' addresses are written")
    serve.add_argument("--max-batch-size", type=int, default=64, help="rows per pipeline call")
    serve.add_argument("--max-wait-ms", type=float, default=2.0, help="wait for more requests under load")
    serve.add_argument("--max-queue", type=int, default=1024, help="waiting requests before 503")
    serve.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024,
                       help="413 above this (the rest of the body is read and discarded, up to 4x this or 128 MiB "
                       "and 2 s, so that a client still sending reads the 413)")
    serve.add_argument("--timeout", type=float, default=30.0, help="seconds per request before 504")
    serve.add_argument("--length-groups", action="store_true",
                       help="text pipelines: run the requests queued together in groups of like length, shortest "
                       "first, each answered when done (short requests answer sooner, long ones no sooner; off by "
                       "default: under closed-loop load it does not lower the p99, docs/serving.md)")
    serve.set_defaults(func=_cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``irbis`` command."""
    from irbis.demo.data import SIZES
    from irbis.kernels.inference import PRECISIONS

    precisions = list(PRECISIONS)
    parser = _Parser(prog="irbis", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="the main job: a camera-trap classifier (Snow Leopard ladder) on Spark",
                          description="Fit and compare raw-pixel logistic regression, EfficientNet-Lite0 features "
                          "cut at 1 and 2 layers, camera-trap augmentation, burst averaging and a trained MLP "
                          "head on camera-trap images split by camera, with 95%% bootstrap intervals and "
                          "camera-grouped cross-validation; write a report and the best pipeline to --output. "
                          "With --text, the text ladder on the drug reviews instead (irbis.demo.text_demo).")
    demo.add_argument("--images", default=None, help="camera-trap set: DIR/metadata.csv (path,label,camera,burst) "
                      "or DIR/<label>/<camera>/<burst>/<image>; default: build one from shipped photographs")
    demo.add_argument("--positive", default="animal", help="label of the class to detect (others are negative)")
    demo.add_argument("--output", default=DEMO_OUTPUT, help="folder for the report, figures and model (--text: "
                      f"{DEMO_OUTPUT}/text by default)")
    _master_option(demo)
    demo.add_argument("--precision", default="fp32", choices=precisions, help="the networks' precision")
    demo.add_argument("--size", default="default", choices=list(SIZES),
                      help="size of the built set (time against confidence; ignored with --images)")
    demo.add_argument("--explain", type=int, default=3, help="test images explained with LIME (0: none)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the built set and of the camera split")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.add_argument("--fine-tune", action="store_true", help="one more rung, +F: EfficientNet-Lite0 fine-tuned "
                      "on the training cameras' images (several minutes more)")
    demo.add_argument("--text", action="store_true", help="the text ladder instead: the drug reviews' sentiment by "
                      "TF-IDF + LR, frozen MiniLM embeddings + LR, an LSTM from scratch and MiniLM fine-tuned, each "
                      "chosen by drug-grouped CV, with 95%% bootstrap intervals")
    demo.add_argument("--rungs", default=None, help="--text: comma-separated rungs to climb (default: all of "
                      "TF-IDF+LR, MiniLM+LR, LSTM, MiniLM-tuned)")
    demo.add_argument("--sample", type=int, default=None, help="--text: a random sample of this many reviews of "
                      "each split (a quick run)")
    demo.add_argument("--folds", type=int, default=3, help="--text: drug-grouped cross-validation folds")
    demo.set_defaults(func=_cmd_demo)

    feat = sub.add_parser("featurize", help="images to pretrained-network features, written as parquet")
    feat.add_argument("images", help="folder (or glob) of images; any filesystem Spark reads")
    feat.add_argument("--output", default="irbis-features", help="parquet output path (columns path, features)")
    _model_option(feat, "--network", "an image network of the catalogue", old="--model")
    feat.add_argument("--cut", type=int, default=1, help="final layers to cut (0: class scores, 1: pooled features)")
    feat.add_argument("--precision", default="fp32", choices=precisions, help="the network's precision")
    feat.add_argument("--glob", default="*.{jpg,jpeg,png,bmp,JPG,JPEG,PNG}", help="file name filter")
    feat.add_argument("--mode", default="errorifexists", choices=["errorifexists", "overwrite"],
                      help="when --output exists")
    feat.add_argument("--vectors", default="array", choices=["array", "ml"],
                       help="how the features are written: array (array<float>, float32, which pandas, DuckDB, "
                       "Polars and vector stores read as lists) or ml (Spark ML vectors, for a Spark ML stage after)")
    _master_option(feat)
    feat.set_defaults(func=_cmd_featurize)

    embed = sub.add_parser("embed", help="texts to sentence embeddings (TextEmbedder), written as parquet")
    embed.add_argument("texts", help="a Parquet or CSV file (or folder of them) with a text column, or a folder of "
                                     ".txt files; any filesystem Spark reads")
    embed.add_argument("--column", default="text", help="the text column (a folder of .txt files gives it)")
    embed.add_argument("--output", default="irbis-embeddings", help="parquet output path (the input's other "
                                                                   "columns, embedding, error)")
    embed.add_argument("--network", default="all_minilm_l6_v2", metavar="NETWORK",
                       help="a text network of the catalogue or a Hugging Face-format folder")
    embed.add_argument("--precision", default="fp32", choices=precisions, help="the network's precision")
    embed.add_argument("--max-length", type=int, default=0, help="tokens per text (0: the network's maximum)")
    embed.add_argument("--mode", default="errorifexists", choices=["errorifexists", "overwrite"],
                       help="when --output exists")
    embed.add_argument("--vectors", default="array", choices=["array", "ml"],
                       help="how the embeddings are written: array (array<float>, float32, which pandas, DuckDB, "
                       "Polars and vector stores read as lists) or ml (Spark ML vectors, for a Spark ML stage after)")
    _master_option(embed)
    embed.set_defaults(func=_cmd_embed)

    train = sub.add_parser("train", help="train a network data-parallel on Spark executors: ImageClassifier "
                           "(fine-tuning) on a folder of images, or TorchEstimator on a parquet of features",
                           description="Train a network data-parallel on Spark executors. --task image fine-tunes "
                           "a catalogue network on a folder of images (ImageClassifier); --task vectors trains "
                           "--network on a parquet of features (TorchEstimator). The training flags left out keep "
                           "the stage's defaults.")
    train.add_argument("data", help="--task image: a folder of images, <label>/.../<image> sub-folders or "
                       "metadata.csv (path, label); --task vectors: parquet with a features column (vector or "
                       "array) and a numeric label")
    train.add_argument("--task", required=True, choices=["image", "vectors"],
                       help="image: ImageClassifier on a folder of images; vectors: TorchEstimator on a parquet")
    train.add_argument("--output", default="irbis-model", help="where the fitted PipelineModel (--task image) or "
                       "TorchModel (--task vectors) is saved")
    _model_option(train, "--backbone", "image: the catalogue network fine-tuned")
    train.add_argument("--freeze-until", default="", help="image: train only the layers after this one (default: "
                       "none, every layer)")
    train.add_argument("--augmentation", default=None, help="image: JSON list of augmentation ops (default: "
                       "ImageClassifier's)")
    _help_later(train.add_argument("--network", default="mlp", help="vectors: the network"),
                lambda: f"vectors: the network, {_architectures_help()} (default: mlp)")
    train.add_argument("--network-options", default="{}", help='vectors: JSON, e.g. \'{"in_features": 64, '
                       '"hidden": 128, "out_features": 10}\'')
    train.add_argument("--features-col", default="features", help="vectors: the features column")
    train.add_argument("--label-col", default="label", help="vectors: the label column")

    def stage_default(flag: str, param: str, what: str, build: Any = None, **kwargs: Any) -> None:
        """A flag whose default is the stage's Param ``param``; ``build()`` gives a longer ``what`` for the help."""
        action = train.add_argument(flag, default=None, help=what, **kwargs)
        _help_later(action, lambda: f"{build() if build else what} (default: {_stage_defaults(param)})")

    stage_default("--epochs", "epochs", "passes over the data", type=int)
    stage_default("--batch-size", "batchSize", "rows per step and training task, or auto (synchronous "
                  "strategies: searched from autoBatchSizes)", type=_batch_size)
    stage_default("--lr-scaling", "lrScaling", "scale the learning rate with the batch one update averages",
                  choices=_Lazy(_lr_scalings), metavar="SCALING")
    stage_default("--training-precision", "trainingPrecision", "the training steps' arithmetic: fp32, bf16 "
                  "(autocast; weights and optimiser in fp32) or auto (bf16 for images on a GPU)",
                  choices=_Lazy(_training_precisions), metavar="PRECISION")
    stage_default("--workers", "numWorkers", "training tasks", type=int)
    stage_default("--strategy", "strategy", "data-parallel strategy", _strategy_help, choices=_Lazy(_strategies),
                  metavar="STRATEGY")
    stage_default("--strategy-options", "strategyOptions", "JSON options of the strategy")
    stage_default("--optimizer", "optimizer", "the optimizer", lambda: f"the optimizer: {_optimizers_help()}")
    stage_default("--learning-rate", "learningRate", "the learning rate", type=float)
    stage_default("--validation-fraction", "validationFraction", "share of the rows held out for validation",
                  type=float)
    train.add_argument("--checkpoint-dir", default=None, help="shared folder: resume after a failed task")
    _master_option(train)
    train.set_defaults(func=_cmd_train)

    pack = sub.add_parser("pack", help="build one PEX file of Irbis and what it needs, for executors whose Python "
                          "lacks them: irbis.get_spark(master, environment=FILE) ships it")
    pack.add_argument("--output", default="irbis-env.pex", help="the PEX file written (a name ending in .pex)")
    pack.add_argument("--no-compress", action="store_true",
                      help="store the files uncompressed: built in about half the time, about three times the size")
    pack.set_defaults(func=_cmd_pack)

    photos = sub.add_parser("photos", help="score the sample photographs with EfficientNet-Lite0 on Spark")
    photos.add_argument("--output", default=DEMO_OUTPUT, help="folder for the photographs")
    _master_option(photos)
    photos.add_argument("--precision", default="fp32", choices=precisions, help="the network's precision")
    photos.set_defaults(func=_cmd_photos)

    classify = sub.add_parser("classify", help="top ImageNet classes of every image in a folder")
    classify.add_argument("images", help="folder of JPEG/PNG/BMP images (searched recursively)")
    _model_option(classify, "--network", "an image network of the catalogue with the 1000 ImageNet classes",
                  num_classes=1000, old="--model")
    classify.add_argument("--precision", default="fp32", choices=precisions, help="the network's precision")
    _master_option(classify)
    classify.add_argument("--top", type=int, default=5, help="classes shown per image")
    classify.set_defaults(func=_cmd_classify)

    explain = sub.add_parser("explain", help="LIME explanations of a saved pipeline's decisions on images or texts",
                             description="Explain a saved PipelineModel (e.g. the demo's model/) with LIME. A pipeline "
                             "that reads an 'image' column: every image of a folder, one overlay PNG per image. A "
                             "pipeline that reads text: the --text texts, or the first --rows texts of a Parquet or "
                             "CSV file (--column) or of a folder of .txt files, a weight per word, one bar chart "
                             "PNG per text. Both write an index.html page in --output; texts also explanations.json.")
    explain.add_argument("pipeline", help="folder of a saved PipelineModel that reads an 'image' or a text column")
    explain.add_argument("source", nargs="?", help="folder of images (searched recursively), or of texts: a "
                         "Parquet or CSV file (or folder of them), or a folder of .txt files")
    explain.add_argument("--text", action="append", help="a text to explain (repeatable), instead of a file")
    explain.add_argument("--column", help="the text column the pipeline reads (default: its one text input)")
    explain.add_argument("--rows", type=int, default=20, help="texts of a file explained (its first)")
    explain.add_argument("--output", default="irbis-explanations", help="folder for the PNGs and index.html")
    explain.add_argument("--target-col", default="probability", help="the pipeline's output column to explain")
    explain.add_argument("--target-class", type=int, default=1, help="index into --target-col")
    explain.add_argument("--samples", type=int, default=300, help="perturbed images or texts per explained one")
    explain.add_argument("--cell-size", type=float, default=32.0, help="superpixel size in pixels")
    explain.add_argument("--top", type=int, default=5, help="superpixels (images) or words (texts) shown")
    explain.add_argument("--glob", default="*.{jpg,jpeg,png,bmp,JPG,JPEG,PNG}", help="image file name filter")
    _master_option(explain)
    explain.set_defaults(func=_cmd_explain)

    _add_serve(sub)

    models = sub.add_parser("models", help="list the models of the repository, or check one: "
                            "irbis models check NAME --precision bf16")
    models.add_argument("action", nargs="?", default="list", choices=["list", "check"])
    _help_later(models.add_argument("name", nargs="?", default=None, help="the model to check"),
                lambda: f"the model to check, of irbis.models.MODELS: {_names(_all_models())}")
    models.add_argument("--precision", default="fp32", choices=precisions, help="check: the precision checked")
    models.add_argument("--engine", default="auto", choices=list(ENGINE_NAMES), help="check: the engine checked")
    models.add_argument("--catalogue", default=None, help="extra catalogue: folder, JSON file or URL")
    models.set_defaults(func=_cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``irbis`` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, TypeError) as err:
        print(f"irbis {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

__all__ = ["main", "build_parser"]
