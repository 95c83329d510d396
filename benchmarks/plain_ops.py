"""The image preprocessing a user writes without Irbis, in OpenCV and numpy: one function that every plain
loop and every peer pipeline of the image benchmarks runs (images.py's (a3), Ray Data's and Daft's rows), so
that they all do the same work. It imports nothing of Irbis: the peers' environment runs it too.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def preprocess_jpeg(content: bytes, prep: dict[str, Any]) -> np.ndarray:
    """An encoded image to the network's (3, H, W) float32 input: decode, shorter side to ``prep["resize_to"]``
    (bicubic, the other side truncated), centre crop to ``prep["input_size"]``, RGB, ``(x - mean) / std``.

    ``prep`` holds the catalogue entry's preprocessing as plain values (``resize_to``, ``input_size``,
    ``mean``, ``std``), so that a process without Irbis can run it.
    """
    import cv2

    height, width = prep["input_size"]
    bgr = cv2.imdecode(np.frombuffer(content, np.uint8), cv2.IMREAD_COLOR)
    h, w, side = *bgr.shape[:2], prep["resize_to"]
    size = (side, max(side, int(side * h / w))) if w < h else (max(side, int(side * w / h)), side)
    bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_CUBIC)
    top, left = round((bgr.shape[0] - height) / 2), round((bgr.shape[1] - width) / 2)
    rgb = cv2.cvtColor(bgr[top:top + height, left:left + width], cv2.COLOR_BGR2RGB)
    return ((rgb.astype(np.float32) - np.float32(prep["mean"])) / np.float32(prep["std"])).transpose(2, 0, 1)
