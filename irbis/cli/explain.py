"""``irbis explain``: LIME explanations of a saved pipeline's decisions on images or texts, as a page."""

from __future__ import annotations

import argparse
from typing import Any

from irbis.cli.common import master_option, text_frame


def add_parser(sub: Any) -> None:
    """Add ``explain`` to the sub-commands ``sub``."""
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
    master_option(explain)
    explain.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Explain the images of a folder with ImageLIME, or texts with TextLIME (:func:`_explain_texts`)."""
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
    from irbis.ml.lime import TextLIME

    if bool(args.text) == bool(args.source):
        raise SystemExit("irbis explain: give either texts (--text, repeatable) or a Parquet/CSV file or folder of "
                         ".txt files, not both and not neither")
    if args.text:
        frame = spark.createDataFrame([(f"text {i + 1}", t) for i, t in enumerate(args.text)],
                                      f"name string, `{column}` string")
    else:
        frame = text_frame(spark, args.source, column)
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
