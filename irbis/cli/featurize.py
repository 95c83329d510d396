"""``irbis featurize``: images to a pretrained network's features (ImageFeaturizer), written as Parquet."""

from __future__ import annotations

import argparse
from typing import Any

from irbis.cli.common import (
    master_option,
    mode_option,
    model_option,
    precision_option,
    vectors_as,
    vectors_option,
)


def add_parser(sub: Any) -> None:
    """Add ``featurize`` to the sub-commands ``sub``."""
    feat = sub.add_parser("featurize", help="images to pretrained-network features, written as parquet")
    feat.add_argument("images", help="folder (or glob) of images; any filesystem Spark reads")
    feat.add_argument("--output", default="irbis-features", help="parquet output path (columns path, features)")
    model_option(feat, "--network", "an image network of the catalogue")
    feat.add_argument("--cut", type=int, default=1, help="final layers to cut (0: class scores, 1: pooled features)")
    precision_option(feat, "the network's precision")
    feat.add_argument("--glob", default="*.{jpg,jpeg,png,bmp,JPG,JPEG,PNG}", help="file name filter")
    mode_option(feat)
    vectors_option(feat, "features")
    master_option(feat)
    feat.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Read the images, featurize them and write ``path, features``; undecodable files are counted and skipped."""
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import ImageReadStats, read_images
    from irbis.spark.session import get_spark

    spark = get_spark(args.master, app_name="irbis-featurize")
    stats = ImageReadStats(spark)
    images = read_images(args.images, dropInvalid=True, spark=spark, stats=stats,
                         pathGlobFilter=args.glob)
    featurizer = ImageFeaturizer(inputCol="image", outputCol="features", network=args.network,
                                 cutOutputLayers=args.cut, precision=args.precision)
    out = vectors_as(featurizer.transform(images).select("path", "features"), "features", args.vectors)
    out.write.mode(args.mode).parquet(args.output)
    print(f"features of {stats.files - stats.bad_files} images written to {args.output}; "
          f"{stats.bad_files} files could not be decoded and were skipped")
    return 0
