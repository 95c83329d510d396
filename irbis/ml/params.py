"""The one Param mechanism of Irbis: each Param declared once, as a table row (as PySpark's shared params are).

A row ``(name, doc, type converter, default[, check])`` becomes a ``Has<Name>`` mixin holding the Param,
its default and its ``get<Name>``/``set<Name>`` (:func:`param_mixin`); :func:`table_mixin` joins the rows
of one stage into one mixin. The rows below are the Params that several stages share, each declared once
here; a stage's own Params are rows in its module, and a stage that shares a row of another table takes
the row itself, by name (:func:`rows_named`). A stage whose default differs from the row's says so in its
``_defaults`` mapping, the one place it states a default; everything else is made from the rows: the
accessors, the checks, and the stage's ``__init__`` and ``setParams`` with keyword-only signatures that
list every Param with its default (:func:`make_stage_init`, :func:`stage_signature`).
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasOutputCol

from irbis.errors import ParamValueError
from irbis.extras import require
from irbis.kernels.batching import TENSOR_DTYPES
from irbis.kernels.device import DEVICES
from irbis.kernels.engines import ENGINE_NAMES
from irbis.kernels.inference import PRECISIONS
from irbis.models import preprocessing_for
from irbis.refs import is_reference, is_unsaved

#: A Param as a table row: name, doc, type converter, default (None: no default), and optionally a
#: check (:func:`one_of`, :func:`at_least`, :func:`in_range`) run eagerly whenever the Param is set.
Row = tuple[Any, ...]


def rows_named(names: Sequence[str], *tables: list[Row]) -> list[Row]:
    """The rows of the Params ``names`` in ``tables``, in the tables' order: a stage that declares some
    Params as another table does takes the rows themselves, never a copy.

    Raises
    ------
    KeyError
        For a name that no table declares, or that two declare.
    """
    found = [row for table in tables for row in table if row[0] in names]
    counts = Counter(row[0] for row in found)
    wrong = [n for n in names if counts[n] != 1]
    if wrong:
        raise KeyError(f"Params declared {[counts[n] for n in wrong]} times in the tables: {wrong}")
    return found


def row_named(name: str, *tables: list[Row]) -> Row:
    """The row of the Param ``name`` in ``tables`` (:func:`rows_named`)."""
    return rows_named([name], *tables)[0]


Check = Callable[[str, Any], None]


def one_of(*values: Any, or_ref: bool = False) -> Check:
    """A check that the value is one of ``values`` (or, with ``or_ref``, a ``package.module:function``
    reference, :mod:`irbis.refs`, or the placeholder of a callable that has none)."""
    def check(name: str, value: Any) -> None:
        if value not in values and not (or_ref and (is_reference(value) or is_unsaved(value))):
            extra = " or 'package.module:function'" if or_ref else ""
            raise ParamValueError(name, value, "one of " + ", ".join(repr(v) for v in values) + extra)
    check.allowed = values  # type: ignore[attr-defined]
    return check


def in_registry(registry: Any) -> Check:
    """A check that the value is a name in ``registry`` as it is when the Param is set (entries may be added)."""
    def check(name: str, value: Any) -> None:
        if value not in registry:
            raise ParamValueError(name, value, "one of " + ", ".join(repr(v) for v in sorted(registry)))
    check.allowed = registry  # type: ignore[attr-defined]
    return check


def in_range(low: float | None = None, high: float | None = None, *, low_open: bool = False,
             high_open: bool = False) -> Check:
    """A check that ``low <= value <= high`` (``<`` where open); None leaves that side unbounded."""
    def check(name: str, value: Any) -> None:
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high or value != value:
            left = "" if low is None else f"{'>' if low_open else '>='} {low}"
            right = "" if high is None else f"{'<' if high_open else '<='} {high}"
            raise ParamValueError(name, value, "a number " + " and ".join(x for x in (left, right) if x))
    check.bounds = (low, high, low_open, high_open)  # type: ignore[attr-defined]
    return check


def at_least(low: float) -> Check:
    """A check that ``value >= low``."""
    return in_range(low)


def checked(name: str, converter: Any, check: Check | None) -> Any:
    """``converter`` followed by ``check`` (unset values, None, pass unchecked)."""
    if check is None:
        return converter

    def convert(value: Any) -> Any:
        value = converter(value)
        if value is not None:
            check(name, value)
        return value
    convert.__name__ = getattr(converter, "__name__", "convert")
    convert.check = check  # type: ignore[attr-defined]
    return convert


def param_check(param: Param) -> Check | None:
    """The check a Param runs when set (None: unchecked), e.g. to enumerate its allowed values."""
    return getattr(param.typeConverter, "check", None)


def invalid_values(check: Check) -> list[Any]:
    """Values that ``check`` refuses: just outside each bound of a range, or a name outside a set."""
    if hasattr(check, "allowed"):
        return ["no-such-" + "-".join(str(v) for v in check.allowed)]
    low, high, low_open, high_open = check.bounds  # type: ignore[attr-defined]
    values = [] if low is None else [low if low_open else low - 1]
    return values + ([] if high is None else [high if high_open else high + 1])

def local_folder(what: str) -> Check:
    """A check that the value (when not empty) is a folder holding ``what`` (images, ``.npy`` arrays or
    texts: which of them suits the stage, its engine checks when it loads the sample)."""
    from irbis.kernels.calibration import calibration_files

    def check(name: str, value: Any) -> None:
        try:
            if value:
                calibration_files(value, texts=True)
        except ValueError as err:
            raise ParamValueError(name, value, f"{what} ({err})") from None
    check.allowed = (what,)  # type: ignore[attr-defined]
    return check


def parsed_by(parse: Callable[[Any], Any], expected: str, allowed: tuple[str, ...]) -> Check:
    """A check that ``parse`` takes the value: its ValueError or TypeError becomes a
    :class:`ParamValueError` saying what was ``expected``, the parser's reason in brackets; ``allowed``
    names the accepted forms (:func:`invalid_values`)."""
    def check(name: str, value: Any) -> None:
        try:
            parse(value)
        except (ValueError, TypeError) as err:
            raise ParamValueError(name, value, f"{expected} ({err})") from None
    check.allowed = allowed  # type: ignore[attr-defined]
    return check


#: imagePreprocessing: empty, a catalogue model with a preprocessing record, or such a record as JSON.
check_preprocessing = parsed_by(preprocessing_for, "a catalogue model name or a JSON preprocessing record",
                                ("a catalogue model or a JSON preprocessing record",))


def to_shapes(value: Any) -> list[list[int]]:
    """``inputShapes``' converter: a list of row shapes (lists of integers >= 1)."""
    shapes = TypeConverters.toListListFloat(value)
    if not all(shape and all(d >= 1 and float(d).is_integer() for d in shape) for shape in shapes):
        raise TypeError(f"inputShapes must be a list of shapes of integers >= 1, e.g. [[3, 8, 8], [4]], "
                        f"found {value!r}")
    return [[int(d) for d in shape] for shape in shapes]


SHARED_PARAMS: list[Row] = [
    ("network", "the network the stage runs or trains: a catalogue name (irbis.models.MODELS), a model folder "
     "(architecture.json + weights, or a Hugging Face-format folder: config.json, safetensors weights, "
     "tokenizer.json) or a file (torch.export .pt2, TorchScript, ONNX), on any Hadoop file system",
     TypeConverters.toString, None),
    ("miniBatchSize", "rows per forward pass of the network", TypeConverters.toInt, 64, at_least(1)),
    ("device", "where the network runs: cpu, cuda or auto (cuda when a GPU is visible)",
     TypeConverters.toString, "cpu", one_of(*DEVICES)),
    ("precision", "numeric precision: fp32, bf16 (bfloat16 matrix products by autocast, fp32 weights, first "
     "and last layer in fp32; on openvino the stem in fp32 and the rest in bf16) or int8 (on onnxruntime static "
     "quantisation of the network calibrated on calibrationData; on torch dynamic quantisation of the Linear layers, "
     "run by ONNX Runtime on the network's export)",
     TypeConverters.toString, "fp32", one_of(*PRECISIONS)),
    ("calibrationData", "the sample that sets int8 activation ranges on an exported engine: a folder, seen by "
     "every worker, of images (preprocessed as the repository model prescribes) or .npy arrays of input rows; "
     "or, when set, a DataFrame holding the stage's input column, of which up to 256 rows (a seeded sample) are "
     "converted as transform converts its input and written as .npy rows to a cached folder, saved with the "
     "stage; empty: crops of photographs shipped with scikit-image (repository models only). Text stages: a "
     "folder of .txt files, or a DataFrame of texts (256 sampled, kept as texts.json); empty: paragraphs of "
     "Python's own documentation (irbis.kernels.calibration.default_calibration_texts)",
     TypeConverters.toString, "", local_folder("a folder of images, .npy arrays or texts")),
    ("engine", "what runs the network: torch (eager PyTorch, channels-last), onnxruntime or openvino (the "
     "network exported once per machine to ONNX), or auto (ONNX Runtime, then OpenVINO, then torch for fp32 on "
     "the CPU, the first installed that runs the network; for bf16 openvino when the CPU has bf16 "
     "instructions, for int8 onnxruntime, then torch; torch on CUDA)",
     TypeConverters.toString, "auto", one_of(*ENGINE_NAMES)),
    ("inputShape", "shape of one input row without the batch axis, e.g. [3, 224, 224]; flat vectors "
     "are reshaped to it", TypeConverters.toListInt, None),
    ("inputCols", "several input columns, exclusive with inputCol: the network's forward takes them as positional "
     "arguments in this order; each a vector, an array of numbers or tensor bytes of inputDtype (float32 beside "
     "columns of numbers)",
     TypeConverters.toListString, None),
    ("inputShapes", "with inputCols: the shape of each column's row without the batch axis, one per column (e.g. "
     "[[3, 8, 8], [4]]); unset: each input flat, of the width its rows have", to_shapes, None),
    ("inputDtype", "element type of a binary input column, whose rows hold the raw little-endian bytes of one "
     "tensor of inputShape: float32, float16 or uint8 (cast to the network's input type in the worker); other "
     "column types ignore it", TypeConverters.toString, "float32", one_of(*TENSOR_DTYPES)),
    ("outputLayer", "name of an inner module (torch) or graph node output (ONNX) whose activation is "
     "returned instead of the final output; empty for the final output", TypeConverters.toString, ""),
    ("errorCol", "column for per-row error messages; empty to raise on the first bad row",
     TypeConverters.toString, None),
    ("tokenBudget", "padded tokens per batch of the network (rows x padded length); rows are sorted by length "
     "within each Arrow batch (in training: each worker's shuffle window) and cut by this budget",
     TypeConverters.toInt, 4096, at_least(8)),
    ("variableLength", "the input column holds sequences whose length varies per row: array<int> token ids or "
     "array<array<float>> (steps x features); rows are sorted by length, cut by tokenBudget and miniBatchSize "
     "and padded per batch with a mask", TypeConverters.toBoolean, False),
    ("imagePreprocessing", "for image inputs: a catalogue model whose preprocessing (resize, centre crop, colour "
     "order, mean/std) the images get, or that record as JSON; binary columns then hold encoded image files. "
     "Empty: image structs are read as they are (CHW, their own channel order) and binary columns hold tensor "
     "bytes", TypeConverters.toString, "", check_preprocessing),
]


def param_mixin(name: str, doc: str, converter: Any, default: Any, check: Check | None = None) -> Any:
    """The ``Has<Name>`` mixin of one table row: the Param, its default, ``get<Name>``, ``set<Name>``.

    With a ``check``, a value outside the allowed set or range raises :class:`ParamValueError` when set.
    The default is declared on the mixin (``_row_defaults``) and set by :func:`declared_defaults`, once,
    after every ``__init__`` of the class has run, so that a stage's own default (``_defaults``) wins.
    """
    set_name, get_name = accessor_names(name)
    return type(f"Has{set_name[3:]}", (_Declared,), {
        name: Param(Params._dummy(), name, doc, typeConverter=checked(name, converter, check)),
        "_row_defaults": {} if default is None else {name: default},
        get_name: _getter(name, doc, get_name), set_name: _setter(name, doc, set_name),
        "__doc__": f"Mixin for the param {name}: {doc}."})


def declared_defaults(cls: type) -> dict[str, Any]:
    """The default of each Param of ``cls``: its row's (``_row_defaults`` of the ``Has*`` mixins), replaced by
    the ``_defaults`` of the stage classes, the more derived class winning."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        out.update(klass.__dict__.get("_row_defaults", {}))
        out.update(klass.__dict__.get("_defaults", {}))
    return out


class _Declared(Params):
    """A Params class whose defaults are declared (:func:`declared_defaults`), set when it is made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._setDefault(**declared_defaults(type(self)))


def accessor_names(name: str) -> tuple[str, str]:
    """Spark ML's ``set<Name>`` and ``get<Name>`` of the Param ``name``."""
    cap = name[0].upper() + name[1:]
    return f"set{cap}", f"get{cap}"


def add_accessors(cls: type) -> type:
    """Give ``cls`` a ``set<Name>`` and a ``get<Name>`` for each Param it declares without them, as Spark
    ML's convention asks of every Param (a setter sets through the Param's converter and check)."""
    for name in dir(cls):
        param = getattr(cls, name, None)
        if not isinstance(param, Param):
            continue
        set_name, get_name = accessor_names(param.name)
        if not hasattr(cls, get_name):
            setattr(cls, get_name, _getter(param.name, param.doc, get_name))
        if not hasattr(cls, set_name):
            setattr(cls, set_name, _setter(param.name, param.doc, set_name))
    return cls


def _getter(name: str, doc: str, method: str) -> Callable[..., Any]:
    def getter(self: Params) -> Any:
        return self.getOrDefault(getattr(self, name))

    getter.__name__, getter.__doc__ = method, f"Gets the value of {name}: {doc.rstrip('.')}."
    return getter


def _setter(name: str, doc: str, method: str) -> Callable[..., Any]:
    def setter(self: Params, value: Any) -> Any:
        return self._set(**{name: value})

    setter.__name__, setter.__doc__ = method, f"Sets the value of {name}: {doc.rstrip('.')}."
    return setter


@functools.cache
def stage_signature(cls: type, returns: Any = None) -> inspect.Signature:
    """The keyword-only signature of a stage's ``__init__`` and ``setParams``: each Param with its default
    (None where it has none), then the other keywords the stage takes (``_extra_keywords``: SynapseML's
    names, a callable that is not a Param), each defaulting to None."""
    defaults = declared_defaults(cls)
    params = sorted((p.name for p in (getattr(cls, n, None) for n in dir(cls)) if isinstance(p, Param)),
                    key=str.lower)
    extra = [n for n in _extra_keywords(cls) if n not in params]
    kw = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(n, kw, default=defaults.get(n)) for n in params]
        + [inspect.Parameter(n, kw, default=None) for n in extra], return_annotation=returns)


def _extra_keywords(cls: type) -> list[str]:
    return [a.name for a in getattr(cls, "SYNAPSEML_ALIASES", ())] + list(getattr(cls, "_extra_keywords", ()))


def make_stage_init(cls: type) -> Callable[..., None]:
    """The ``__init__`` of a stage ``cls``, made from its Params: a check that the optional extras it names
    in ``_extras`` are installed (:func:`irbis.extras.require`), the class's ``__init__`` chain, the declared
    defaults (:func:`declared_defaults`), the stage's ``_init_state`` hook, then the keywords given, as
    PySpark's ``keyword_only`` constructors do (what the user passed is set, the rest are defaults; the stage's
    ``_keywords`` hook turns them into Param values), and its ``_check_params`` hook."""
    stage: Any = cls  # a class made by __init_subclass__, which a checker cannot follow

    def __init__(self: Any, **kwargs: Any) -> None:
        if "_making" in self.__dict__:  # an inner __init__ of the chain: the outermost sets the Params
            super(stage, self).__init__()
            return
        require(type(self).__name__, getattr(self, "_extras", ()))
        self.__dict__["_making"] = True
        try:
            super(stage, self).__init__()
        finally:
            del self.__dict__["_making"]
        self._setDefault(**declared_defaults(type(self)))
        self._init_state()
        set_keywords(self, kwargs)

    __init__.__signature__ = stage_signature(cls, None)  # type: ignore[attr-defined]
    __init__.__doc__ = f"Make a {cls.__name__}: every Param as a keyword, the rest keep their defaults."
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def set_keywords(stage: Any, kwargs: dict[str, Any]) -> Any:
    """Set the keywords given to a stage's ``__init__`` or ``setParams`` (through its ``_keywords`` hook),
    then run its ``_check_params``; a keyword that is neither a Param nor one the stage takes raises
    TypeError, as a signature would."""
    unknown = sorted(set(kwargs) - set(stage_signature(type(stage)).parameters))  # type: ignore[arg-type]
    if unknown:
        raise TypeError(f"{type(stage).__name__} got unknown arguments {unknown}")
    stage._input_kwargs = kwargs
    stage._set(**stage._keywords(dict(kwargs)))
    stage._check_params()
    return stage


def make_set_params(cls: type) -> Callable[..., Any]:
    """``setParams`` of a stage ``cls``: the keywords given set, as its ``__init__`` sets them."""
    def setParams(self: Any, **kwargs: Any) -> Any:  # noqa: N802
        return set_keywords(self, kwargs)

    setParams.__signature__ = stage_signature(cls, cls.__name__)  # type: ignore[attr-defined]
    setParams.__doc__ = "Set any of the Params by keyword."
    setParams.__qualname__ = f"{cls.__qualname__}.setParams"
    return setParams


(HasNetwork, HasMiniBatchSize, HasDevice, HasPrecision, HasCalibrationData, HasEngine, HasInputShape,
 HasInputCols, HasInputShapes, HasInputDtype, HasOutputLayer, HasErrorCol, HasTokenBudget, HasVariableLength,
 HasImagePreprocessing) = (
    param_mixin(*row) for row in SHARED_PARAMS
)


def table_mixin(class_name: str, rows: list[Row], shared: tuple[type, ...] = ()) -> Any:
    """One mixin holding the Params of ``rows`` plus the ``shared`` ``Has*`` mixins.

    Examples
    --------
    >>> from pyspark.ml.param import TypeConverters
    >>> Mixin = table_mixin("HasEpochs", [("epochs", "passes over the data", TypeConverters.toInt, 10)])
    >>> Mixin().getEpochs()
    10
    """
    bases = tuple(param_mixin(*row) for row in rows) + shared
    return type(class_name, bases, {"__doc__": f"Params: {', '.join(r[0] for r in rows)}."})


@add_accessors
class KeywordInit:
    """Placed before PySpark's ``Has*`` mixins (whose ``__init__`` takes nothing), it tells a type checker that a
    stage's ``__init__``, made from its Params at import (:mod:`irbis.ml.base`), takes them as keywords."""

    if TYPE_CHECKING:
        def __init__(self, **kwargs: Any) -> None: ...


class ColumnSetters(KeywordInit, HasInputCol, HasOutputCol):
    """``inputCol``/``outputCol`` with ``setInputCol``/``setOutputCol``, as PySpark's own stages have."""


__all__ = ["SHARED_PARAMS", "ParamValueError", "row_named", "rows_named", "one_of", "in_registry", "in_range",
           "at_least", "checked", "param_check", "invalid_values", "ColumnSetters", "param_mixin", "accessor_names",
           "add_accessors", "table_mixin", "KeywordInit", "declared_defaults", "make_stage_init", "make_set_params",
           "stage_signature", "HasNetwork", "HasMiniBatchSize", "HasDevice", "HasPrecision",
           "HasCalibrationData", "HasEngine", "local_folder", "parsed_by", "HasInputShape", "HasInputCols",
           "HasInputShapes", "to_shapes", "HasInputDtype",
           "HasOutputLayer", "HasErrorCol", "HasTokenBudget", "HasVariableLength", "HasImagePreprocessing",
           "check_preprocessing"]
