"""``irbis pack``: compressed (the default) against ``--no-compress``, side by side in one run.

For each setting, from this environment (Irbis and its packages, PyTorch among them): the seconds to build
the PEX, its size, and an executor's first start from it, ``python irbis-env.pex -c "import irbis, torch"``
with an empty ``PEX_ROOT`` (the PEX installs its packages there on its first start, as on a fresh executor),
then a second start (installed already). The settings alternate, ``--repeats`` times each; the table gives
each run.

Usage: ``python benchmarks/pack.py [--repeats 1]``; results are printed and written to
``benchmarks/results/pack.txt``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import Run

RESULTS = Path(__file__).resolve().parent / "results"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
SETTINGS = {"compressed (default)": True, "--no-compress": False}


def start_seconds(pex: Path, root: Path) -> float:
    """Seconds for ``pex`` to start and import irbis and torch, with its packages installed under ``root``."""
    env = {**os.environ, "PEX_ROOT": str(root)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(pex), "-c", "import irbis, torch"], env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--output", default=str(RESULTS / "pack.txt"))
    args = parser.parse_args()
    from irbis.spark.environment import pack

    run = Run(__file__, packages=("torch", "pex", "numpy"))
    rows = []
    for repeat in range(args.repeats):
        for name, compress in SETTINGS.items():
            with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
                packed = pack(Path(tmp) / "irbis-env.pex", compress=compress)
                first = start_seconds(packed.path, Path(tmp) / "pex-root")
                second = start_seconds(packed.path, Path(tmp) / "pex-root")
            rows.append(f"| {name} | {repeat + 1} | {packed.seconds:.1f} | {packed.bytes / 2**20:.0f} | {first:.1f} "
                        f"| {second:.1f} |")
            print(rows[-1], flush=True)
    lines = [*run.header("irbis pack of this environment (Irbis and its packages, without pyspark and py4j); first "
                         "start: the PEX installs its packages into an empty PEX_ROOT, then imports irbis and torch"),
             "", "| setting | run | build s | size MiB | first start s | second start s |", "|---|---|---|---|---|---|",
             *rows]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
