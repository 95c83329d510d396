"""``irbis photos``: the sample photographs scored with EfficientNet-Lite0 on Spark."""

from __future__ import annotations

import argparse
from typing import Any

from irbis.cli.common import DEMO_OUTPUT, master_option, precision_option


def add_parser(sub: Any) -> None:
    """Add ``photos`` to the sub-commands ``sub``."""
    photos = sub.add_parser("photos", help="score the sample photographs with EfficientNet-Lite0 on Spark")
    photos.add_argument("--output", default=DEMO_OUTPUT, help="folder for the photographs")
    master_option(photos)
    precision_option(photos, "the network's precision")
    photos.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the sample photographs to ``--output`` and print each one's top three classes."""
    from irbis.demo.photos import classify_photos, write_sample_photos
    from irbis.extras import require

    require("irbis photos", ["demo"])

    folder = write_sample_photos(args.output)
    print(f"Scoring the sample photographs in {folder} with EfficientNet-Lite0 on Spark {args.master}")
    for path, labels in classify_photos(str(folder), precision=args.precision, master=args.master, top=3):
        print(f"{path.split('/')[-1]:16s} " + ", ".join(f"{n} ({p:.2f})" for n, p in labels))
    return 0
