"""Where static int8 loses the answers of EfficientNet-Lite0: recipes, and each layer kept in fp32.

ONNX Runtime's static QDQ quantisation (weights int8 per output channel, activations uint8) is
calibrated once on the sample that ``precision="int8"`` uses (:mod:`irbis.kernels.calibration`); the
ranges are cached (``calibration_cache_path``), so that every variant below is quantised from the
same ranges in a second. Each variant is scored by its top-1 agreement with fp32 ONNX Runtime on
the photo crops of :func:`irbis.demo.photos.photo_crops`, run by ONNX Runtime and by OpenVINO
(which reads the QDQ file and runs int8 kernels).

Three studies: (1) recipes: calibration method, the stem in fp32, 16-bit activations with 8-bit
weights and 8-bit activations with 16-bit weights (which tells whether the weights or the
activations lose the answers); (2) sensitivity: each Conv/Gemm kept in fp32 alone, ranked by the
mean squared logit error left on the calibration sample; (3) the k most sensitive kept in fp32.

``--nncf`` runs NNCF's post-training quantisation of the OpenVINO model instead (``pip install nncf``),
calibrated on the same sample: its default, full bias correction, the ``MIXED`` preset (asymmetric
activations), channel alignment, the stem and the classifier in fp32, the depthwise convolutions in
fp32, and ``quantize_with_accuracy_control`` (agreement on the calibration crops, ``max_drop=0.01``;
several minutes), each with its images/s in a plain loop (OpenVINO, 2 threads, batch 64) beside fp32
ONNX Runtime and OpenVINO.

Usage: ``python benchmarks/int8_layers.py [--crops-per-photo 24] [--method MinMax] [--nncf] [--quick]``
(``--quick``: 2 crops per photo, five nodes, no accuracy control, to check that the script runs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import numpy as np


def quantise(source: str, target: str, cache: str, batch: np.ndarray, method: str, **options) -> None:
    """Static QDQ quantisation of ``source``, calibrated on ``batch`` once (ranges cached in ``cache``)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from irbis.kernels.engines.quantize import _Reader

    name = onnx.load(source, load_external_data=False).graph.input[0].name
    settings = {"per_channel": True, "activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8}
    settings.update(options)
    with contextlib.redirect_stdout(io.StringIO()):
        quantize_static(source, target, None if Path(cache).exists() else _Reader(name, batch),
                        quant_format=QuantFormat.QDQ, calibrate_method=getattr(CalibrationMethod, method),
                        calibration_cache_path=cache, **settings)


def outputs(path: str, engine: str, x: np.ndarray) -> np.ndarray:
    """The logits of ``x`` from the ONNX file at ``path`` run by ``engine``, fp32 kernels asked for."""
    from irbis.kernels.engines import ENGINES

    run = ENGINES[engine].load(path, threads=2, device="cpu", precision="fp32")
    return np.concatenate([run(np.ascontiguousarray(x[i:i + 32])) for i in range(0, len(x), 32)])


def images_per_s(run, x: np.ndarray, repeats: int = 3) -> float:
    """The best of ``repeats`` timings of two batches of 64 rows of ``x`` through ``run``."""
    batch = np.ascontiguousarray(np.resize(x, (64, *x.shape[1:])))
    run(batch)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run(batch), run(batch)
        best = min(best, time.perf_counter() - start)
    return 128 / best


def nncf_recipes(ops: list[str]) -> dict[str, dict]:
    """NNCF's settings tried, by label; ``ops`` are the model's convolutions and matmuls, in order."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters as Advanced

    return {"default": {}, "full bias correction": {"fast_bias_correction": False},
            "MIXED preset": {"preset": nncf.QuantizationPreset.MIXED},
            "channel alignment": {"advanced_parameters": Advanced(disable_channel_alignment=False)},
            "stem and classifier in fp32": {"ignored_scope": nncf.IgnoredScope(names=[ops[0], ops[-1]])},
            "depthwise in fp32": {"ignored_scope": nncf.IgnoredScope(types=["GroupConvolution"])},
            "accuracy control": {"max_drop": 0.01, "drop_type": nncf.DropType.ABSOLUTE}}


def nncf_study(source: str, x: np.ndarray, cal: np.ndarray, ref: np.ndarray, quick: bool) -> None:
    """NNCF's recipes on the OpenVINO model of ``source``: agreement with ``ref`` on ``x``, and speed."""
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters as Restorer

    from irbis.kernels.engines import ENGINES
    from irbis.kernels.engines.ov import compile_graph

    def runner(model):
        request = compile_graph(model, threads=2).create_infer_request()
        return lambda a: np.array(request.infer({0: np.ascontiguousarray(a)})[0], copy=True)

    def logits(run, a):
        return np.concatenate([run(a[i:i + 64]) for i in range(0, len(a), 64)])

    data = nncf.Dataset([cal[i:i + 1] for i in range(len(cal))])
    ops = [o.get_friendly_name() for o in ov.Core().read_model(source).get_ordered_ops()
           if o.get_type_name() in ("Convolution", "GroupConvolution", "MatMul")]
    ref_cal = logits(runner(source), cal).argmax(1)
    check = nncf.Dataset([(cal[i:i + 16], ref_cal[i:i + 16]) for i in range(0, len(cal), 16)])
    recipes = nncf_recipes(ops)
    speeds = {"fp32 onnxruntime": images_per_s(ENGINES["onnxruntime"].load(source, threads=2, device="cpu",
                                                                           precision="fp32"), x),
              "fp32 openvino": images_per_s(runner(source), x)}
    for label, options in recipes.items():
        if "max_drop" in options and quick:
            continue
        model = ov.Core().read_model(source)
        if "max_drop" in options:
            model = nncf.quantize_with_accuracy_control(
                model, data, check, lambda m, items: float(np.mean([m(a)[0].argmax(1) == y for a, y in items])),
                subset_size=len(cal), advanced_accuracy_restorer_parameters=Restorer(), **options)
        else:
            model = nncf.quantize(model, data, subset_size=len(cal), **options)
        run = runner(model)
        agree, speeds[f"nncf {label}"] = float((logits(run, x).argmax(1) == ref).mean()), images_per_s(run, x)
        print(f"nncf {label:36s} agreement on {len(x)} crops {agree:.3f}", flush=True)
    fastest = max(speeds["fp32 onnxruntime"], speeds["fp32 openvino"])
    for label, speed in speeds.items():
        print(f"{label:41s} {speed:7.1f} images/s  {speed / fastest:.2f}x the best fp32 engine")


def main() -> None:
    import onnx
    from onnxruntime.quantization import QuantType

    from irbis.demo.photos import photo_crops
    from irbis.kernels.calibration import make_calibration
    from irbis.kernels.engines.export import export_onnx
    from irbis.models import ModelRepository, get_entry

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crops-per-photo", type=int, default=24)
    parser.add_argument("--method", default="MinMax", choices=("MinMax", "Entropy", "Percentile"))
    parser.add_argument("--nncf", action="store_true", help="NNCF's recipes on OpenVINO instead")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    name = "efficientnet_lite0"
    x = photo_crops(name, 2 if args.quick else args.crops_per_photo)
    cal = make_calibration("", get_entry(name).preprocessing).batch((3, 224, 224))
    source = str(export_onnx(lambda: ModelRepository().load_model(name), None, (3, 224, 224),
                             "int8-layers-efficientnet-lite0"))
    ref, ref_cal = outputs(source, "onnxruntime", x).argmax(1), outputs(source, "onnxruntime", cal)
    if args.nncf:
        return nncf_study(source, x, cal, ref, args.quick)
    nodes = [n.name for n in onnx.load(source, load_external_data=False).graph.node if n.op_type in ("Conv", "Gemm")]
    work = tempfile.mkdtemp(prefix="int8-layers-")
    cache, target = f"{work}/ranges-{args.method}.json", f"{work}/q.onnx"

    def score(label: str, **options) -> float:
        quantise(source, target, cache, cal, args.method, **options)
        agree = {e: float((outputs(target, e, x).argmax(1) == ref).mean()) for e in ("onnxruntime", "openvino")}
        print(f"{label:40s} agreement on {len(x)} crops: onnxruntime {agree['onnxruntime']:.3f}  "
              f"openvino {agree['openvino']:.3f}", flush=True)
        return float(((outputs(target, "onnxruntime", cal) - ref_cal) ** 2).mean())

    print(f"(1) recipes, {args.method} ranges on {len(cal)} calibration crops")
    score("all int8")
    score("stem in fp32", nodes_to_exclude=nodes[:1])
    score("16-bit activations, 8-bit weights", activation_type=QuantType.QUInt16)
    score("8-bit activations, 16-bit weights", weight_type=QuantType.QInt16)
    print("(2) one node in fp32 (mean squared logit error on the calibration crops)")
    chosen = nodes[:5] if args.quick else nodes
    ranked = sorted((score(f"  {n} in fp32", nodes_to_exclude=[n]), n) for n in chosen)
    print("(3) the k most sensitive nodes in fp32")
    for k in (1, 3) if args.quick else (5, 10, 20, 30, 40):
        score(f"  {k} nodes in fp32", nodes_to_exclude=[n for _, n in ranked[:k]])


if __name__ == "__main__":
    main()
