"""``irbis pack``: one PEX file of Irbis and what it needs, for executors whose Python lacks them."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    """Add ``pack`` to the sub-commands ``sub``."""
    pack = sub.add_parser("pack", help="build one PEX file of Irbis and what it needs, for executors whose Python "
                          "lacks them: irbis.get_spark(master, environment=FILE) ships it")
    pack.add_argument("--output", default="irbis-env.pex", help="the PEX file written (a name ending in .pex)")
    pack.add_argument("--no-compress", action="store_true",
                      help="store the files uncompressed: built in about half the time, about three times the size")
    pack.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the PEX file and say how to ship it."""
    from irbis.spark.environment import pack

    packed = pack(args.output, compress=not args.no_compress)
    print(f"{packed.path}: {packed.bytes / 2**20:.0f} MiB, built in {packed.seconds:.0f} s; executors need "
          f"Python {packed.python}. Ship it with irbis.get_spark(master, environment={str(packed.path)!r})")
    return 0
