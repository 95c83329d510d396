"""``irbis models``: the models of the repository, or a check of one at a precision and engine."""

from __future__ import annotations

import argparse
from typing import Any

from irbis.cli.common import help_later, names, precision_option


def _all_models() -> list[str]:
    from irbis.models import MODELS

    return sorted(MODELS)


def add_parser(sub: Any) -> None:
    """Add ``models`` to the sub-commands ``sub``."""
    from irbis.kernels.engines import ENGINE_NAMES

    models = sub.add_parser("models", help="list the models of the repository, or check one: "
                            "irbis models check NAME --precision bf16")
    models.add_argument("action", nargs="?", default="list", choices=["list", "check"])
    help_later(models.add_argument("name", nargs="?", default=None, help="the model to check"),
               lambda: f"the model to check, of irbis.models.MODELS: {names(_all_models())}")
    precision_option(models, "check: the precision checked")
    models.add_argument("--engine", default="auto", choices=list(ENGINE_NAMES), help="check: the engine checked")
    models.add_argument("--catalogue", default=None, help="extra catalogue: folder, JSON file or URL")
    models.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List the repository's models (with ``--catalogue``'s), or check one (``check NAME``)."""
    from irbis.models import ModelRepository

    if args.action == "check":
        return _check(args)
    repo = ModelRepository(catalogue=args.catalogue)
    for entry in repo.entries():
        weights = "weights shipped" if entry.uri else "architecture only"
        print(f"{entry.name:24s} {entry.architecture:20s} input {list(entry.input_shape)}  {weights}  "
              f"feature layers {list(entry.layers)}")
    return 0


def _check(args: argparse.Namespace) -> int:
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
