"""Cut an exported ONNX graph in two at its stem, so that each part can run at its own precision.

On EfficientNet-Lite0, OpenVINO's bf16 flips top-1 of real-photo crops mainly in the first
convolution (the raw input and the stem's weights rounded to 8 bits of mantissa): keeping the stem in
fp32 and the rest in bf16 raised top-1 agreement with fp32 from 0.964 to 1.000 on the 56 crops of
``irbis models check`` (from 0.982 to 0.988 on 168 crops; keeping the last convolutions or the
classifier in fp32 as well did not raise it further). OpenVINO's CPU plugin does not honour per-node precision marks
(``disable_fp16_compression``) for bf16, so the stem is compiled as a graph of its own.
"""

from __future__ import annotations

from typing import Any


def stem_cut(graph: Any) -> str | None:
    """The first tensor after the first convolution through which everything passes (None: none).

    ``graph`` is an ``onnx.GraphProto`` whose nodes are in topological order (as exporters write them);
    the tensor returned is the only value computed so far that later nodes read, so the graph splits there.
    """
    last_read: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            last_read[name] = i
    live = {t.name for t in graph.input} - {t.name for t in graph.initializer}
    seen_conv = False
    for i, node in enumerate(graph.node[:-1]):
        made = set() if node.op_type == "Constant" else set(node.output)  # constants are copied, not cut
        live = {t for t in live | made if last_read.get(t, -1) > i}
        seen_conv = seen_conv or node.op_type == "Conv"
        if seen_conv and node.op_type != "Conv" and len(live) == 1:
            return next(iter(live))
    return None


def read_stem_cut(path: str) -> str | None:
    """:func:`stem_cut` of the ONNX file at ``path`` (read without its weights)."""
    import onnx

    return stem_cut(onnx.load(path, load_external_data=False).graph)
