"""``irbis embed``: texts to sentence embeddings (TextEmbedder), written as Parquet."""

from __future__ import annotations

import argparse
from typing import Any

from irbis.cli.common import (
    master_option,
    mode_option,
    precision_option,
    text_frame,
    vectors_as,
    vectors_option,
)


def add_parser(sub: Any) -> None:
    """Add ``embed`` to the sub-commands ``sub``."""
    embed = sub.add_parser("embed", help="texts to sentence embeddings (TextEmbedder), written as parquet")
    embed.add_argument("texts", help="a Parquet or CSV file (or folder of them) with a text column, or a folder of "
                                     ".txt files; any filesystem Spark reads")
    embed.add_argument("--column", default="text", help="the text column (a folder of .txt files gives it)")
    embed.add_argument("--output", default="irbis-embeddings", help="parquet output path (the input's other "
                                                                   "columns, embedding, error)")
    embed.add_argument("--network", default="all_minilm_l6_v2", metavar="NETWORK",
                       help="a text network of the catalogue or a Hugging Face-format folder")
    precision_option(embed, "the network's precision")
    embed.add_argument("--max-length", type=int, default=0, help="tokens per text (0: the network's maximum)")
    mode_option(embed)
    vectors_option(embed, "embeddings")
    master_option(embed)
    embed.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Embed the texts and write them with the input's other columns; a row that fails says why in ``error``."""
    from irbis.ml.text_network import TextEmbedder
    from irbis.spark.session import get_spark

    spark = get_spark(args.master, app_name="irbis-embed")
    texts = text_frame(spark, args.texts, args.column)
    embedder = TextEmbedder(network=args.network, inputCol=args.column, outputCol="embedding",
                            precision=args.precision, maxLength=args.max_length, errorCol="error")
    out = vectors_as(embedder.transform(texts).drop(args.column), "embedding", args.vectors)
    out.write.mode(args.mode).parquet(args.output)
    written = spark.read.parquet(args.output)
    failed = written.where("embedding is null").count()
    print(f"embeddings of {written.count() - failed} texts written to {args.output}; {failed} rows have none "
          "(their reason is in the column error)")
    return 0
