"""A small camera-trap photo set built from real photographs that ship with scikit-image and scikit-learn.

Camera traps take a short *burst* of frames whenever their motion sensor fires; most bursts show
terrain, plants or people, a few show the animal being surveyed, often small, half out of frame,
dark or camouflaged. This module rebuilds that situation deterministically (one ``seed``) from real
photographs, so the demo needs no download:

* **terrain** (each camera's background): scikit-image's ``grass``, ``gravel``, ``brick`` and
  ``moon`` (grey rock surface), the field of ``camera`` and scikit-learn's ``china.jpg``; every camera
  looks at its own crop and zoom of one of them, with its own tint, exposure and a day (colour) or
  night-vision (grey, noisy) sensor;
* **the animal** (class ``animal``): crops of the cat of scikit-image's ``chelsea`` at 25-65 % of the
  frame height, soft-edged and blended into the terrain, entering, crossing, leaving or lingering in the
  frame during the burst (so some frames of an animal burst show no animal, as in real traps);
* **other triggers** (class ``empty``): half of the empty bursts show a person (``astronaut``,
  matplotlib's ``grace_hopper.jpg``), a motorcycle, a cup of coffee or a rocket in the same way,
  so "something is in front of the camera" does not give the label away; the other half are
  terrain only (wind, light changes).

Frames of a burst differ by a small camera shake, the object's motion, exposure and sensor noise.
Test and training cameras differ in their terrain, so a classifier must generalise to new places.

Layout written by :func:`build_camera_trap_set`::

    <root>/metadata.csv                         path,label,camera,burst,frame,timestamp
    <root>/<label>/<camera>/<burst>/<frame>.jpg e.g. animal/cam03/cam03-b05/0.jpg

``path`` in the CSV is relative to ``<root>``. The same layout (or any folder with such a CSV) is
what ``irbis demo --images DIR`` reads, so a real camera-trap set plugs in unchanged.

Examples
--------
>>> root = build_camera_trap_set("trap-photos", cameras=4, bursts_per_camera=3)  # doctest: +SKIP
"""
from __future__ import annotations

import csv
import datetime as dt
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from irbis.extras import optional

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

__all__ = ["FRAME_SIZE", "METADATA_COLUMNS", "SIZES", "build_camera_trap_set", "check_size", "render_burst", "sources"]

#: Frame (height, width) of the built set: a small 4:3 camera-trap picture.
FRAME_SIZE = (240, 320)
#: Columns of ``metadata.csv``.
METADATA_COLUMNS = ("path", "label", "camera", "burst", "frame", "timestamp")
#: ``--size`` of the built set: (cameras, bursts per camera, frames per burst); a quarter of the
#: cameras are held out for the test (2, 4 and 8 cameras).
SIZES = {"small": (8, 6, 3), "default": (16, 16, 4), "large": (32, 16, 4)}


def check_size(size: str) -> tuple[int, int, int]:
    """The (cameras, bursts per camera, frames per burst) of ``--size``; a clear error for an unknown one."""
    if size not in SIZES:
        raise ValueError(f"--size {size!r} does not exist; choose one of {', '.join(SIZES)} "
                         f"({', '.join(f'{k}: {c * b * f} images' for k, (c, b, f) in SIZES.items())})")
    return SIZES[size]


_START = dt.datetime(2024, 6, 1, 0, 0, 0)


def _rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., None], 3, axis=2) if gray.ndim == 2 else gray[..., :3]


@functools.lru_cache(maxsize=1)
def sources() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The shipped photographs as RGB uint8 arrays: ``(terrains, objects)``; ``objects["cat"]`` is the animal.

    Cached: treat the arrays as read-only.
    """
    from skimage import data
    from sklearn.datasets import load_sample_image

    field = data.camera()[330:512, :]  # the grass field below the cameraman
    terrains = {"grass": data.grass(), "gravel": data.gravel(), "brick": data.brick(),
                "moon": data.moon(), "field": field, "china": load_sample_image("china.jpg")}
    objects = {"cat": data.chelsea()[10:300, 40:420], "astronaut": data.astronaut()[20:512, 60:460],
               "motorcycle": data.stereo_motorcycle()[0], "coffee": data.coffee()[0:400, 60:560],
               "rocket": data.rocket()[0:427, 200:440]}
    hopper = _grace_hopper()
    if hopper is not None:
        objects["person"] = hopper
    return ({k: _rgb(v) for k, v in terrains.items()}, {k: _rgb(v) for k, v in objects.items()})


def _grace_hopper() -> np.ndarray | None:
    try:
        from matplotlib import cbook
    except ImportError:  # pragma: no cover - matplotlib is a demo dependency
        return None
    with open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False), "rb") as f:
        bgr = cv2.imdecode(np.frombuffer(f.read(), np.uint8), cv2.IMREAD_COLOR)
    return None if bgr is None else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


@dataclass(frozen=True)
class Camera:
    """One camera: its terrain crop, tint, exposure and sensor."""

    name: str
    terrain: np.ndarray  # RGB float32, a little larger than the frame (room for camera shake)
    tint: np.ndarray     # per-channel gains
    exposure: float
    night: bool


def _make_camera(name: str, index: int, terrains: dict[str, np.ndarray], rng: np.random.Generator) -> Camera:
    keys = sorted(terrains)
    src = terrains[keys[index % len(keys)]]
    h, w = FRAME_SIZE[0] + 16, FRAME_SIZE[1] + 16
    zoom = rng.uniform(0.45, 1.0) * min(src.shape[0] / h, src.shape[1] / w)
    ch, cw = int(h * zoom), int(w * zoom)
    y, x = rng.integers(0, src.shape[0] - ch + 1), rng.integers(0, src.shape[1] - cw + 1)
    terrain = cv2.resize(src[y:y + ch, x:x + cw], (w, h), interpolation=cv2.INTER_AREA).astype(np.float32)
    night = bool(rng.random() < 0.5)
    tint = np.ones(3, np.float32) if night else rng.uniform(0.8, 1.2, 3).astype(np.float32)
    return Camera(name, terrain, tint, float(rng.uniform(0.7, 1.1)), night)


def _soft_mask(h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    r = ((yy - h / 2) / (h / 2)) ** 2 + ((xx - w / 2) / (w / 2)) ** 2
    return np.clip((1.0 - r) * 3.0, 0.0, 1.0)


@dataclass(frozen=True)
class _Track:
    """An object moving through a burst: its picture, size and path."""

    picture: np.ndarray
    height: int
    x0: float
    y0: float
    dx: float
    opacity: float


def _make_track(obj: np.ndarray, frames: int, rng: np.random.Generator) -> _Track:
    # A random crop of the object (a part of the animal is often all the camera sees).
    oh, ow = obj.shape[:2]
    ch, cw = int(oh * rng.uniform(0.6, 1.0)), int(ow * rng.uniform(0.6, 1.0))
    y, x = rng.integers(0, oh - ch + 1), rng.integers(0, ow - cw + 1)
    picture = obj[y:y + ch, x:x + cw].astype(np.float32)
    if rng.random() < 0.5:
        picture = picture[:, ::-1]
    height = int(FRAME_SIZE[0] * rng.uniform(0.25, 0.65))
    x0, dx = _motion(height * picture.shape[1] / picture.shape[0], frames, rng)
    return _Track(np.ascontiguousarray(picture), height, x0=x0, y0=float(rng.uniform(0.1, 0.7) * FRAME_SIZE[0]),
                  dx=dx, opacity=float(rng.uniform(0.6, 1.0)))


def _motion(width: float, frames: int, rng: np.random.Generator) -> tuple[float, float]:
    """Start and step (pixels per frame) of an object that enters, crosses, leaves or lingers in the frame."""
    frame_w, span = FRAME_SIZE[1], max(frames - 1, 1)
    inside, outside = rng.uniform(0.0, frame_w - width * 0.5), -width * rng.uniform(0.6, 1.0)
    kind = rng.choice(["enter", "cross", "leave", "linger"], p=[0.3, 0.25, 0.3, 0.15])
    start, end = {"enter": (outside, inside), "cross": (outside, frame_w + width * 0.2 - width),
                  "leave": (inside, outside), "linger": (inside, inside + rng.uniform(-20, 20))}[kind]
    if rng.random() < 0.5:  # the same motion from the other side of the frame
        start, end = frame_w - width - start, frame_w - width - end
    return float(start), float((end - start) / span)


def _paste(canvas: np.ndarray, track: _Track, t: int) -> None:
    h = track.height
    w = max(int(h * track.picture.shape[1] / track.picture.shape[0]), 1)
    pic = cv2.resize(track.picture, (w, h), interpolation=cv2.INTER_AREA)
    alpha = _soft_mask(h, w)[..., None] * track.opacity
    x, y = int(round(track.x0 + track.dx * t)), int(round(track.y0))
    x1, y1 = max(x, 0), max(y, 0)
    x2, y2 = min(x + w, canvas.shape[1]), min(y + h, canvas.shape[0])
    if x2 <= x1 or y2 <= y1:
        return  # the object has left the frame
    sub_pic, sub_a = pic[y1 - y:y2 - y, x1 - x:x2 - x], alpha[y1 - y:y2 - y, x1 - x:x2 - x]
    canvas[y1:y2, x1:x2] = sub_a * sub_pic + (1.0 - sub_a) * canvas[y1:y2, x1:x2]


def render_burst(camera: Camera, track: _Track | None, frames: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The RGB uint8 frames of one burst of ``camera`` (``track``: the object passing, if any)."""
    light = rng.uniform(0.6, 1.3)  # time of day / cloud cover of this burst
    out = []
    for t in range(frames):
        sy, sx = rng.integers(0, 17, 2)
        canvas = camera.terrain[sy:sy + FRAME_SIZE[0], sx:sx + FRAME_SIZE[1]].copy()
        if track is not None:
            _paste(canvas, track, t)
        canvas *= camera.tint * camera.exposure * light * rng.uniform(0.9, 1.1)
        if camera.night:
            gray = canvas.mean(axis=2, keepdims=True)
            canvas = np.repeat(gray, 3, axis=2) + rng.normal(0.0, 10.0, gray.shape).astype(np.float32)
        out.append(np.clip(canvas, 0, 255).astype(np.uint8))
    return out


def _write_jpeg(path: Path, rgb: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90]):
        raise OSError(f"could not write {path}")


def build_camera_trap_set(folder: str | Path, *, cameras: int = 16, bursts_per_camera: int = 16,
                          frames_per_burst: int = 4, animal_fraction: float = 0.4, seed: int = 0,
                          progress: Callable[[int], None] | None = None) -> Path:
    """Write the camera-trap set (JPEGs + ``metadata.csv``) under ``folder`` and return ``folder``.

    Parameters
    ----------
    folder : str or Path
        Output folder (created; files of an earlier build with the same names are replaced).
    cameras, bursts_per_camera, frames_per_burst : int
        Size: ``cameras * bursts_per_camera * frames_per_burst`` images (1,024 by default,
        ``SIZES["default"]``).
    animal_fraction : float
        Share of bursts with the animal; every camera gets at least one animal and one empty burst.
    seed : int
        The same seed writes the same pixels.
    progress : callable, optional
        Called with the number of images written after each burst (e.g. ``tqdm.update``).
    """
    if cameras < 1 or bursts_per_camera < 2 or frames_per_burst < 1:
        raise ValueError(f"need cameras >= 1, bursts_per_camera >= 2 and frames_per_burst >= 1, found "
                         f"{cameras}, {bursts_per_camera}, {frames_per_burst}")
    if not 0.0 < animal_fraction < 1.0:
        raise ValueError(f"animal_fraction must be in (0, 1), found {animal_fraction}")
    root = Path(folder)
    terrains, objects = sources()
    others = sorted(k for k in objects if k != "cat")
    rows = []
    for c in range(cameras):
        rng = np.random.default_rng([seed, c])
        camera = _make_camera(f"cam{c:02d}", c, terrains, rng)
        n_animal = min(max(int(round(animal_fraction * bursts_per_camera)), 1), bursts_per_camera - 1)
        labels = rng.permutation(["animal"] * n_animal + ["empty"] * (bursts_per_camera - n_animal))
        clock = _START + dt.timedelta(days=int(rng.integers(0, 30)))
        for b, label in enumerate(labels):
            clock += dt.timedelta(hours=float(rng.uniform(2, 40)))
            burst = f"{camera.name}-b{b:02d}"
            obj = objects["cat"] if label == "animal" else (
                objects[others[rng.integers(len(others))]] if rng.random() < 0.5 else None)
            track = None if obj is None else _make_track(obj, frames_per_burst, rng)
            for f, rgb in enumerate(render_burst(camera, track, frames_per_burst, rng)):
                rel = f"{label}/{camera.name}/{burst}/{f}.jpg"
                _write_jpeg(root / rel, rgb)
                stamp = (clock + dt.timedelta(seconds=f)).replace(microsecond=0).isoformat(sep=" ")
                rows.append((rel, str(label), camera.name, burst, f, stamp))
            if progress is not None:
                progress(frames_per_burst)
    with open(root / "metadata.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(METADATA_COLUMNS)
        writer.writerows(rows)
    return root
