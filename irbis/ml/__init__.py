"""Spark ML stages of Irbis (the adapters over the pure kernels).

``__all__`` lists every public stage; the conformance suite tests each one.
"""

from irbis.ml.onnx_model import ONNXModel
from irbis.ml.torch_model import TorchModel

__all__ = ["ONNXModel", "TorchModel"]
