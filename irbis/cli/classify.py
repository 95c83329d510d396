"""``irbis classify``: the top ImageNet classes of every image in a folder."""

from __future__ import annotations

import argparse
from typing import Any

from irbis.cli.common import master_option, model_option, precision_option


def add_parser(sub: Any) -> None:
    """Add ``classify`` to the sub-commands ``sub``."""
    classify = sub.add_parser("classify", help="top ImageNet classes of every image in a folder")
    classify.add_argument("images", help="folder of JPEG/PNG/BMP images (searched recursively)")
    model_option(classify, "--network", "an image network of the catalogue with the 1000 ImageNet classes",
                 num_classes=1000)
    precision_option(classify, "the network's precision")
    master_option(classify)
    classify.add_argument("--top", type=int, default=5, help="classes shown per image")
    classify.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print each image's path and its ``--top`` classes with their probabilities."""
    from irbis.demo.photos import classify_photos
    from irbis.extras import require

    require("irbis classify", ["images"])

    table = classify_photos(args.images, model=args.network, precision=args.precision, master=args.master,
                            top=args.top)
    for path, labels in table:
        print(path)
        for name, prob in labels:
            print(f"    {prob:6.3f}  {name}")
    return 0
