"""Which layers of EfficientNet-Lite0 flip top-1 when OpenVINO runs them in bf16.

OpenVINO's CPU plugin takes one inference precision per compiled model; the per-node runtime info
that keeps a node in its original precision (``disable_fp16_compression``) changes nothing in bf16
here (a model with every node marked gives the same flips as plain bf16). So the network is split at a
cut (an op whose output is the only value that later ops read), each part compiled with its own
precision, and for each cut both orders are measured: fp32 up to the cut then bf16, and bf16 up to the
cut then fp32. The flips are the photo crops whose top-1 differs from fp32 ONNX Runtime (which equals
eager PyTorch); the crops are :func:`irbis.demo.photos.photo_crops`.

Usage: ``python benchmarks/bf16_layers.py [--crops-per-photo 24] [--every 5] [--quick]``
(``--quick``: 2 crops per photo and three cuts, to check that the script runs).
"""

from __future__ import annotations

import argparse

import numpy as np


def cut_points(ops: list) -> list[int]:
    """Positions of ops (in topological order) whose one output is all that later ops read."""
    last_use = [-1] * len(ops)
    position = {o.get_friendly_name(): i for i, o in enumerate(ops)}
    for i, op in enumerate(ops):
        for inp in op.inputs():
            src = inp.get_source_output().get_node()
            if src.get_type_name() != "Constant":
                last_use[position[src.get_friendly_name()]] = i
    cuts, reach = [], -1
    for i, op in enumerate(ops):
        if op.get_type_name() == "Constant":
            continue
        if reach <= i and op.get_type_name() not in ("Parameter", "Result") and op.get_output_size() == 1:
            cuts.append(i)
        reach = max(reach, last_use[i])
    return cuts


def split(path: str, position: int) -> tuple:
    """The model at ``path`` as two models, the first ending with op ``position``'s output."""
    import openvino as ov

    core = ov.Core()
    m1 = core.read_model(path)
    front = ov.Model([m1.get_ordered_ops()[position].output(0)], m1.get_parameters())
    m2 = core.read_model(path)
    out = m2.get_ordered_ops()[position].output(0)
    param = ov.op.Parameter(ov.Type.f32, out.get_partial_shape())
    for target in list(out.get_target_inputs()):
        target.replace_source_output(param.output(0))
    return front, ov.Model(m2.get_results(), [param])


def _runner(model, precision: str):
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                      "INFERENCE_NUM_THREADS": "2"})
    request = compiled.create_infer_request()
    return lambda x: np.array(request.infer({0: x})[0], copy=True)


def _tops(run, x: np.ndarray) -> np.ndarray:
    return np.concatenate([run(np.ascontiguousarray(x[i:i + 32])) for i in range(0, len(x), 32)]).argmax(1)


def main() -> None:
    import openvino as ov

    from irbis.demo.photos import photo_crops
    from irbis.kernels.engines.export import export_onnx
    from irbis.kernels.engines.ort import load as load_ort
    from irbis.models import ModelRepository

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crops-per-photo", type=int, default=24)
    parser.add_argument("--every", type=int, default=5, help="measure every k-th cut")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    x = photo_crops("efficientnet_lite0", 2 if args.quick else args.crops_per_photo)
    path = str(export_onnx(lambda: ModelRepository().load_model("efficientnet_lite0"), None, (3, 224, 224),
                           "bf16-layers-efficientnet-lite0"))
    ref = _tops(load_ort(path, threads=2, device="cpu", precision="fp32"), x)
    ops = ov.Core().read_model(path).get_ordered_ops()
    cuts = cut_points(ops)
    chosen = cuts[:: max(1, len(cuts) // 2)][:3] if args.quick else cuts[:: args.every]
    print(f"{len(x)} crops; whole network in bf16: {(_tops(_runner(path, 'bf16'), x) != ref).sum()} flips")
    for position in chosen:
        front, back = split(path, position)
        row = [f"cut {cuts.index(position):3d}/{len(cuts)} {ops[position].get_type_name():16s}"]
        for first, second in (("f32", "bf16"), ("bf16", "f32")):
            run_front, run_back = _runner(front, first), _runner(back, second)
            flips = int((_tops(lambda b: run_back(run_front(b)), x) != ref).sum())
            row.append(f"{first} then {second}: {flips} flips")
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
