"""``irbis train``: a network trained data-parallel on Spark executors, ImageClassifier on a folder of images or
TorchEstimator on a Parquet of features; the training flags left out keep the stage's defaults."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from irbis.cli.common import Lazy, help_later, master_option, model_option, names

#: ``irbis train``'s flags that set a Param of the task's stage (ImageClassifier or TorchEstimator) when given,
#: else leave the stage's default: flag dest -> Param.
TRAIN_PARAMS = {"epochs": "epochs", "batch_size": "batchSize", "workers": "numWorkers", "strategy": "strategy",
                "strategy_options": "strategyOptions", "optimizer": "optimizer", "learning_rate": "learningRate",
                "validation_fraction": "validationFraction", "lr_scaling": "lrScaling",
                "training_precision": "trainingPrecision",
                "checkpoint_dir": "checkpointDir", "augmentation": "augmentation"}

#: Image file suffixes that ``irbis train`` picks up from a folder.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def train_params(args: argparse.Namespace) -> dict[str, Any]:
    """The Params ``irbis train``'s flags set (those given on the command line)."""
    return {param: getattr(args, dest) for dest, param in TRAIN_PARAMS.items() if getattr(args, dest) is not None}


def _strategies() -> Any:
    from irbis.train.strategies import STRATEGIES

    return STRATEGIES


def _lr_scalings() -> Any:
    from irbis.train.optim import LR_SCALINGS

    return LR_SCALINGS


def _training_precisions() -> Any:
    from irbis.train.loop import TRAINING_PRECISIONS

    return TRAINING_PRECISIONS


def _stage_defaults(param: str) -> str:
    """The help for a flag whose default is the stage's: ``param``'s default on ImageClassifier (``--task
    image``) and TorchEstimator (``--task vectors``)."""
    from irbis.ml import ImageClassifier, TorchEstimator

    image, vectors = (stage().getOrDefault(param) for stage in (ImageClassifier, TorchEstimator))
    if image == vectors:
        return f"the stages' {param}, {image}"
    return f"the stage's {param}: ImageClassifier's {image} (--task image), TorchEstimator's {vectors} (--task vectors)"


def _architectures_help() -> str:
    from irbis.models.architectures import ARCHITECTURES

    return (f"an architecture (irbis.models.ARCHITECTURES: {names(ARCHITECTURES)}), a TorchScript file, or "
            "'package.module:function'")


def _optimizers_help() -> str:
    from irbis.train.optim import OPTIMIZERS

    return f"{names(OPTIMIZERS)}, or 'package.module:function' (params -> torch.optim.Optimizer)"


def _strategy_help() -> str:
    """The strategies of :data:`irbis.train.strategies.STRATEGIES`, synchronous and parameter-server."""
    strategies = _strategies()
    sync = [name for name, cls in strategies.items() if not cls.owns_update]
    server = [name for name, cls in strategies.items() if cls.owns_update]
    return (f"data-parallel strategy (irbis.train.strategies.STRATEGIES): {names(sync)} (synchronous); "
            f"{names(server)} (parameter server)")


def _strategy_options_help() -> str:
    """``--strategy-options``, naming the parameter servers' rules from their registry."""
    from irbis.train.ps.rules import rule_names

    return (f"JSON options of the strategy, e.g. '{{\"groupSize\": 4}}' for mixed; the parameter-server "
            f"strategies' serverOptimizer: {rule_names()}")


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


def add_parser(sub: Any) -> None:
    """Add ``train`` to the sub-commands ``sub``."""
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
    model_option(train, "--backbone", "image: the catalogue network fine-tuned")
    train.add_argument("--freeze-until", default="", help="image: train only the layers after this one (default: "
                       "none, every layer)")
    train.add_argument("--augmentation", default=None, help="image: JSON list of augmentation ops (default: "
                       "ImageClassifier's)")
    help_later(train.add_argument("--network", default="mlp", help="vectors: the network"),
               lambda: f"vectors: the network, {_architectures_help()} (default: mlp)")
    train.add_argument("--network-options", default="{}", help='vectors: JSON, e.g. \'{"in_features": 64, '
                       '"hidden": 128, "out_features": 10}\'')
    train.add_argument("--features-col", default="features", help="vectors: the features column")
    train.add_argument("--label-col", default="label", help="vectors: the label column")

    def stage_default(flag: str, param: str, what: str, build: Any = None, **kwargs: Any) -> None:
        """A flag whose default is the stage's Param ``param``; ``build()`` gives a longer ``what`` for the help."""
        action = train.add_argument(flag, default=None, help=what, **kwargs)
        help_later(action, lambda: f"{build() if build else what} (default: {_stage_defaults(param)})")

    stage_default("--epochs", "epochs", "passes over the data", type=int)
    stage_default("--batch-size", "batchSize", "rows per step and training task, or auto (synchronous "
                  "strategies: searched from autoBatchSizes)", type=_batch_size)
    stage_default("--lr-scaling", "lrScaling", "scale the learning rate with the batch one update averages",
                  choices=Lazy(_lr_scalings), metavar="SCALING")
    stage_default("--training-precision", "trainingPrecision", "the training steps' arithmetic: fp32, bf16 "
                  "(autocast; weights and optimiser in fp32) or auto (bf16 for images on a GPU)",
                  choices=Lazy(_training_precisions), metavar="PRECISION")
    stage_default("--workers", "numWorkers", "training tasks", type=int)
    stage_default("--strategy", "strategy", "data-parallel strategy", _strategy_help, choices=Lazy(_strategies),
                  metavar="STRATEGY")
    stage_default("--strategy-options", "strategyOptions", "JSON options of the strategy", _strategy_options_help)
    stage_default("--optimizer", "optimizer", "the optimizer", lambda: f"the optimizer: {_optimizers_help()}")
    stage_default("--learning-rate", "learningRate", "the learning rate", type=float)
    stage_default("--validation-fraction", "validationFraction", "share of the rows held out for validation",
                  type=float)
    train.add_argument("--checkpoint-dir", default=None, help="shared folder: resume after a failed task")
    master_option(train)
    train.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Fit the task's stage and save it to ``--output``, printing the training summary."""
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
                               inputCol=args.features_col, labelCol=args.label_col, **train_params(args))
    model = estimator.fit(data)
    model.write().overwrite().save(args.output)
    _print_summary(model)
    print(f"fitted TorchModel saved to {args.output}")
    return 0


def _train_images(args: argparse.Namespace, spark: Any) -> int:
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import IndexToString

    from irbis.ml import ImageClassifier

    data, labels = _image_folder_frame(spark, args.data)
    clf = ImageClassifier(backbone=args.backbone, imageCol="content", numClasses=max(2, len(labels)),
                          freezeUntil=args.freeze_until, **train_params(args))
    model = clf.fit(data)
    pipeline = PipelineModel([model, IndexToString(inputCol="prediction", outputCol="predictedLabel", labels=labels)])
    pipeline.write().overwrite().save(args.output)
    _print_summary(model)
    print(f"fitted PipelineModel (ImageClassifierModel, IndexToString over {labels}) saved to {args.output}")
    return 0


def _print_summary(model: Any) -> None:
    """One line per record of the fitted model's ``training_summary`` (an epoch's loss, accuracy, ...)."""
    for record in model.training_summary or []:
        print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))


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
    classes = sorted(meta["label"].unique())
    index = {n: i for i, n in enumerate(classes)}
    labels = spark.createDataFrame(pd.DataFrame({"path": ["file:" + p for p in meta["path"]],
                                                 "label": [index[n] for n in meta["label"]]}))
    files = spark.read.format("binaryFile").load([f"file:{p}" for p in meta["path"]]).select("path", "content")
    return files.join(labels, "path"), classes
