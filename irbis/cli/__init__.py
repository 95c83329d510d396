"""The ``irbis`` command line: ``irbis demo | featurize | embed | score | train | pack | photos | classify | explain
| serve | models``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from irbis.cli import classify, demo, embed, explain, featurize, models, pack, photos, score, serve, train
from irbis.cli.common import Parser, plain_text
from irbis.errors import MissingExtraError

#: The sub-commands, in the order the help lists them; each module adds its parser (``add_parser``) and runs it.
COMMANDS = (demo, featurize, embed, score, train, pack, photos, classify, explain, serve, models)


def build_parser() -> Parser:
    """The argument parser of the ``irbis`` command."""
    parser = Parser(prog="irbis", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``irbis`` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MissingExtraError as err:  # it names the stage or the command itself
        print(err, file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, TypeError) as err:
        print(f"irbis {args.command}: {err}", file=sys.stderr)
        return 2


__all__ = ["COMMANDS", "build_parser", "main", "plain_text"]
