"""int8 quantisation of an exported ONNX file, cached beside the export: static, calibrated on a sample, or dynamic.

ONNX Runtime's post-training quantisation (QDQ, weights int8 per output channel, activations uint8)
with the ranges of the activations set by the ``Percentile`` calibrator on a sample of real inputs
(:mod:`irbis.kernels.calibration`); the first convolution stays in fp32. On EfficientNet-Lite0 this
was the best of the recipes tried, measured against fp32 on real-photo crops that calibration did not
see: top-1 agreement about 0.93, short of 0.99 (min-max 0.89, entropy 0.88, depthwise convolutions
left in fp32 0.71-0.84); ``irbis models check`` reports the figure of the network at hand.
``benchmarks/int8_layers.py`` says where the answers go (168 crops, min-max ranges): the weights lose
them more than the activations (16-bit weights with 8-bit activations 0.976, 16-bit activations with
8-bit weights 0.923), and no few layers carry the loss: keeping the 40 most sensitive of the 50
Conv/Gemm nodes in fp32 still leaves 0.946 (OpenVINO running the same QDQ file: 0.958).
NNCF's post-training quantisation of the OpenVINO model (``int8_layers.py --nncf``, same sample and
crops) does no better: default 0.845 at about 1.5x OpenVINO fp32 (the faster fp32 engine in that run,
2 threads, batch 64); full bias correction and channel alignment change nothing, the ``MIXED``
preset 0.804, stem and classifier in fp32 0.821, depthwise convolutions in fp32 0.923 at the same
speed; ``quantize_with_accuracy_control`` (``max_drop=0.01`` on the calibration crops) keeps 16 of
76 quantisers, agrees 1.000 on the calibration crops but 0.958 on the others, at about 1.05x. Calibrating
on other crops of the scored photographs reaches 0.935: the sample costs some, not the gap to 0.99.
So ``precision="int8"`` stays on ONNX Runtime; NNCF serves only that study.

Dynamic quantisation (:func:`dynamic_path`) needs no sample: the weights of the fully connected layers
(``MatMul``, and ``Gemm`` rewritten as ``MatMul`` + ``Add``) become 8-bit per output channel, their inputs
are quantised per batch as it runs, and convolutions stay in fp32. Weights and inputs are both unsigned:
signed int8 weights against unsigned inputs saturate the 16-bit sums of the CPUs without VNNI
instructions (AVX2 alone), which took a small MLP's largest error from 0.01 to 0.2 of its output range.
It is what ``precision="int8"`` with ``engine="torch"`` runs, in the place of PyTorch's deprecated
``torch.ao.quantization.quantize_dynamic`` (the same recipe on ``nn.Linear``): top-1 agreement with fp32
on EfficientNet-Lite0, whose one fully connected layer is its classifier, 1.000 on the 56 crops of
``irbis models check`` and on 168, where PyTorch's (per-tensor weights) gave 0.982 on both.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from irbis.kernels.calibration import Calibration
from irbis.models.fetch import atomic_path, file_lock


def quantized_path(path: str, calibration: Calibration, shape: tuple[int, ...]) -> Path:
    """The int8 file of the ONNX file at ``path``, written once per content and calibration sample."""
    source = Path(path)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = source.with_name(f"{source.stem}.int8-{digest}-{calibration.key}.onnx")
    with file_lock(source.parent / ".locks" / f"{target.stem}.lock"):
        if not target.exists():
            batch = calibration.batch(shape)
            with atomic_path(target) as tmp:
                quantize(str(source), str(tmp), batch)
    return target


def dynamic_path(path: str) -> Path:
    """The dynamic int8 file of the ONNX file at ``path`` (see the module docstring), written once per content."""
    source = Path(path)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = source.with_name(f"{source.stem}.int8-dynamic-{digest}.onnx")
    with file_lock(source.parent / ".locks" / f"{target.stem}.lock"):
        if not target.exists():
            with atomic_path(target) as tmp:
                quantize_linear(str(source), str(tmp))
    return target


def quantize_linear(source: str, target: str) -> None:
    """Write the dynamic int8 quantisation of the fully connected layers of ``source`` to ``target``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(source)
    del model.graph.value_info[:]  # the exporter's shape notes, which ONNX Runtime's shape inference redoes
    gemm_as_matmul(model.graph)
    with _no_advice():
        quantize_dynamic(model, target, op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QUInt8)


def gemm_as_matmul(graph: Any) -> None:
    """Rewrite each ``Gemm`` of ``graph`` whose weight is a constant (``nn.Linear``: ``x @ W.T + b``) as
    ``MatMul`` + ``Add``, the form ONNX Runtime's dynamic quantisation takes; other nodes stay as they are."""
    from onnx import helper, numpy_helper

    weights = {t.name: t for t in graph.initializer}
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in weights or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weights[node.input[1]])
        name, bias = f"{node.input[1]}.matmul", len(node.input) > 2 and node.input[2]
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w.T if attrs.get("transB") else w), name))
        product = f"{node.output[0]}.product" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], name], [product], name=f"{node.name}.matmul"))
        if bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}.bias"))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    unused = [t for t in graph.initializer if t.name not in used]
    for tensor in unused:
        graph.initializer.remove(tensor)


def quantize(source: str, target: str, batch: np.ndarray) -> None:
    """Write the static int8 (QDQ) quantisation of ``source`` calibrated on ``batch`` to ``target``."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    graph = onnx.load(source, load_external_data=False).graph
    convs = [n.name for n in graph.node if n.op_type == "Conv"]
    with contextlib.redirect_stdout(io.StringIO()), _no_advice():  # the calibrator prints its progress
        quantize_static(source, target, _Reader(graph.input[0].name, batch), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        nodes_to_exclude=convs[:1], calibrate_method=CalibrationMethod.Percentile)


class _Reader:
    """ONNX Runtime's calibration reader protocol over mini-batches of ``batch``."""

    def __init__(self, name: str, batch: np.ndarray, size: int = 8) -> None:
        self.feeds = iter([{name: batch[i:i + size]} for i in range(0, len(batch), size)])

    def get_next(self) -> dict[str, Any] | None:
        return next(self.feeds, None)


class _Advice(logging.Filter):
    """Drops the quantiser's advice to pre-process the model first (symbolic shape inference and graph
    optimisation, which ONNX Runtime applies when it loads the file anyway), logged on the root logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing" not in record.getMessage()


@contextlib.contextmanager
def _no_advice() -> Any:
    advice = _Advice()
    logging.getLogger().addFilter(advice)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(advice)


def nncf_transformer_path(path: str, key: str, batches: Callable[[], list[tuple[np.ndarray, np.ndarray]]]) -> Path:
    """The OpenVINO model (``.xml`` and ``.bin``) of NNCF's post-training int8 quantisation of the ONNX
    transformer at ``path`` (two inputs: token ids and attention mask), written once per content and
    calibration sample ``key``; ``batches()`` gives the sample as (ids, mask) batches.

    NNCF's ``TRANSFORMER`` model type: weights int8 per channel, activations int8 with ranges from the
    sample, SmoothQuant on the matrix products, and the operations that lose the answers (softmax, layer
    norm, GELU, the additions of the residual stream) kept in floating point. ``benchmarks/text.py`` measures
    it on all_minilm_l6_v2 over the drug reviews against fp32 and ONNX Runtime's dynamic int8
    (:func:`dynamic_path`).
    """
    source = Path(path)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = source.with_name(f"{source.stem}.int8-nncf-{digest}-{key}.xml")
    with file_lock(source.parent / ".locks" / f"{target.stem}.lock"):
        if not target.exists():
            import nncf
            import openvino as ov

            nncf.set_log_level(logging.ERROR)

            model = ov.Core().read_model(str(source))
            names = [model.inputs[0].any_name, model.inputs[1].any_name]
            sample = batches()
            # NNCF draws progress bars on standard output; a worker's output is no place for them
            with _no_advice(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                quantized = nncf.quantize(model, nncf.Dataset(sample, lambda b: dict(zip(names, b))),
                                          model_type=nncf.ModelType.TRANSFORMER, subset_size=len(sample))
            staging = target.with_name(f".{target.stem}-{os.getpid()}.xml")
            ov.save_model(quantized, str(staging))
            os.replace(staging.with_suffix(".bin"), target.with_suffix(".bin"))
            os.replace(staging, target)
    return target
