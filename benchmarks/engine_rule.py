"""The basis of ``engine="auto"``'s rule: each engine's plain fp32 loop on this machine.

For EfficientNet-Lite0 and ResNet-50, 224x224x3 float inputs, batch 64, one process with 2 threads:
eager channels-last PyTorch, ONNX Runtime and OpenVINO (the network exported once by Irbis's
``torch.export``-based exporter). It prints images/s per engine and the order ``auto`` should follow;
:func:`irbis.kernels.engines.auto_order` states the rule these figures support.

Usage: ``python benchmarks/engine_rule.py [--images 256] [--repeats 2] [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inference import ENGINES_PLAIN, MODELS, spawn  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="64 images, 1 timed run, EfficientNet-Lite0")
    args = parser.parse_args()
    models = ["effnet"] if args.quick else list(MODELS)
    n, repeats = (64, 1) if args.quick else (args.images, args.repeats)
    workdir = Path(tempfile.mkdtemp(prefix="irbis-engine-rule-"))
    from irbis.kernels.engines import ENGINES, auto_order

    for key in models:
        speeds = {}
        for engine in [e for e in ENGINES_PLAIN if e == "torch" or ENGINES[e].installed()]:
            result = spawn("plain_engine", key, n, repeats, workdir, engine=engine, threads=2)
            speeds[engine] = n / float(np.median(result["times"]))
        order = sorted(speeds, key=speeds.get, reverse=True)
        print(f"{MODELS[key]}: " + ", ".join(f"{e} {speeds[e]:.1f} img/s" for e in order)
              + f"; fastest first: {order}")
    print(f"auto's rule (fp32, cpu): {list(auto_order('cpu', 'fp32'))}")


if __name__ == "__main__":
    main()
