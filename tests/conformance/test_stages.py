"""The stage harness: every public Irbis stage meets the same contract.

For each entry of ``stage_cases.STAGE_CASES``: persistence round trip alone and inside a
Pipeline (same outputs after load), the stage's kernel (``kernel()``, and ``load_local`` of the saved
stage) against its Spark rows, random inputs from hypothesis (nulls, NaN, unicode, long
strings, empty frames and partitions, single rows), errors naming a missing or wrongly typed
column, and input DataFrames (Spark and pandas) left with the same schema and rows. A public
stage without an entry fails the suite.
"""
from __future__ import annotations

import datetime as dt
import math

import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.errors import AnalysisException
from pyspark.ml import Estimator, Pipeline, PipelineModel, Transformer
from pyspark.ml.linalg import Vector, Vectors, VectorUDT
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, DateType, DoubleType, IntegerType, StringType, TimestampType

from stage_cases import STAGE_CASES, StageCase, registered_names

NAMES = sorted(STAGE_CASES)
SCHEMA_ERRORS = (ValueError, TypeError, AnalysisException)


def _is_stage(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Transformer | Estimator)


def test_every_public_stage_has_a_case():
    import irbis.ml

    public = {name for name in irbis.ml.__all__ if _is_stage(getattr(irbis.ml, name))}
    missing = sorted(public - registered_names())
    assert not missing, f"public stages without an entry in tests/conformance/stage_cases.py: {missing}"


# -- eager checks -------------------------------------------------------------------------------
def _checked_params() -> list:
    """(stage case, Param, refused value) for every checked Param of every stage, from the checks themselves."""
    from irbis.ml.params import invalid_values, param_check

    cases = []
    for name in NAMES:
        stage = STAGE_CASES[name].make_stage()
        for param in stage.params:
            check = param_check(param)
            for bad in invalid_values(check) if check else []:
                cases.append(pytest.param(name, param.name, bad, id=f"{name}-{param.name}={bad}"))
    return cases


@pytest.mark.parametrize(("name", "param", "bad"), _checked_params())
def test_out_of_range_value_fails_at_set_time(name, param, bad):
    """Each checked Param refuses a value outside its set or range when set, naming the Param and the value."""
    from irbis.ml.params import ParamValueError

    stage = STAGE_CASES[name].make_stage()
    before = stage.extractParamMap()
    setter = getattr(stage, "set" + param[0].upper() + param[1:], None)
    with pytest.raises(ParamValueError) as info:
        setter(bad) if setter is not None else stage._set(**{param: bad})
    assert info.value.name == param and param in str(info.value) and repr(bad) in str(info.value)
    assert stage.extractParamMap() == before


def test_every_stage_checks_some_param():
    """The generated cases cover the shared and the stage-specific checks."""
    covered = {(values[0], values[1]) for values in (p.values for p in _checked_params())}
    for stage, param in [("TorchModel", "miniBatchSize"), ("TorchEstimator", "numWorkers"),
                         ("TorchEstimator", "strategy"), ("Repartition", "numPartitions"),
                         ("ImageLIME", "samplingFraction"), ("EnsembleByKey", "strategy")]:
        assert (stage, param) in covered


# -- helpers -------------------------------------------------------------------------------------
def _norm(value: object) -> object:
    if isinstance(value, Vector):
        return tuple(_norm(float(x)) for x in value.toArray())
    if isinstance(value, float):
        return "nan" if math.isnan(value) else round(value, 9)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return tuple(_norm(v) for v in value.values())
    if isinstance(value, list | tuple):
        return tuple(_norm(v) for v in value)
    if hasattr(value, "tolist"):
        return _norm(value.tolist())
    return value


def rows_of(df) -> list[tuple]:
    """Collected rows, normalised (vectors as tuples, NaN as a string) and sorted."""
    return sorted((tuple(_norm(v) for v in row) for row in df.collect()), key=repr)


def to_pandas(df) -> pd.DataFrame:
    """``toPandas`` with vectors as numpy arrays, as Irbis kernels see them."""
    pdf = df.toPandas()
    for field in df.schema.fields:
        if isinstance(field.dataType, VectorUDT):
            pdf[field.name] = [None if v is None else v.toArray() for v in pdf[field.name]]
    return pdf


def fit_stage(case: StageCase, df):
    """Build the case's stage and fit it when it is an estimator; return (stage, transformer)."""
    stage = case.make_stage()
    if isinstance(stage, Estimator):
        model = stage.fit(df)
        assert type(model).__name__ == case.fitted
        assert isinstance(model, type(stage)._model_class), f"{type(stage).__name__} declares another Model class"
        return stage, model
    return stage, stage


#: (stage, transformer) of each case fitted on its own frame, per session: an estimator is fitted once per
#: run on ``make_frame(spark)`` and its model reused by every test that only reads it (the tests whose
#: subject is a fit, on other frames or columns, still fit).
_FITTED: dict[tuple[str, int], tuple] = {}


def fitted(name: str, spark) -> tuple:
    """``fit_stage`` of case ``name`` on ``make_frame(spark)``, computed once per session. The stage and
    model are shared, so a test must not set their Params."""
    key = (name, id(spark))
    if key not in _FITTED:
        case = STAGE_CASES[name]
        _FITTED[key] = fit_stage(case, case.make_frame(spark))
    return _FITTED[key]


# -- persistence and unchanged inputs -------------------------------------------------------------
#: For the cases whose subject runs no Spark (the pandas path, the kernels) or is the classic session's: skipped
#: under --connect, where test_connect_gives_the_classic_results checks each stage on Connect
CLASSIC_COVERS_CONNECT = pytest.mark.classic_only(
    reason="its subject runs no Spark (the pandas path, the kernels) or is the classic session's; "
           "test_connect_gives_the_classic_results checks each stage on Connect")


def _pandas_rows(pdf: pd.DataFrame) -> list[tuple]:
    """A pandas frame's rows, normalised (to check that a stage left its input as it was)."""
    return [tuple(_norm(v) for v in r) for r in pdf.itertuples(index=False)]


def _param_values(stage) -> dict:
    """A stage's explicitly set and default Params, by name (values compared as Spark ML saves them)."""
    return {p.name: stage.getOrDefault(p) for p in stage.params if stage.isDefined(p)}


@pytest.mark.spark
@pytest.mark.parametrize("name", NAMES)
def test_round_trips_and_unchanged_input(spark, tmp_path, name):
    """Same outputs after save/load alone and inside a Pipeline; the input is left as it was."""
    case = STAGE_CASES[name]
    df = case.make_frame(spark)
    schema, before = df.schema, rows_of(df)
    stage, model = fitted(name, spark)
    expected = rows_of(model.transform(df))
    model.save(str(tmp_path / "model"))
    assert rows_of(type(model).load(str(tmp_path / "model")).transform(df)) == expected
    PipelineModel(stages=[model]).save(str(tmp_path / "pipeline_model"))
    assert rows_of(PipelineModel.load(str(tmp_path / "pipeline_model")).transform(df)) == expected
    Pipeline(stages=[stage]).save(str(tmp_path / "pipeline"))
    again = Pipeline.load(str(tmp_path / "pipeline"))
    assert type(again.getStages()[0]) is type(stage)
    loaded, given = _param_values(again.getStages()[0]), _param_values(stage)
    copied = {k for k, v in loaded.items() if isinstance(v, str) and v.startswith(str(tmp_path))}  # files saved
    assert {k: v for k, v in loaded.items() if k not in copied} == {k: v for k, v in given.items() if k not in copied}
    assert copied <= set(given)
    if not isinstance(stage, Estimator):  # an estimator's refit is a second fit of the Params just compared
        assert rows_of(again.fit(df).transform(df)) == expected
    assert df.schema == schema and rows_of(df) == before
    if case.pandas and not case.keeps_rows:  # test_pandas_gives_the_spark_results checks the others' input
        pdf = to_pandas(df)
        snapshot = _pandas_rows(pdf)
        fit_stage(case, pdf)[1].transform(pdf)
        assert _pandas_rows(pdf) == snapshot


@pytest.mark.spark
@CLASSIC_COVERS_CONNECT
@pytest.mark.parametrize("name", [n for n in NAMES if STAGE_CASES[n].pandas and STAGE_CASES[n].keeps_rows])
def test_pandas_gives_the_spark_results(spark, name):
    """The stage's pandas path (the kernel alone, as serving and LIME call it) gives Spark's rows."""
    case = STAGE_CASES[name]
    df = case.make_frame(spark)
    out = fitted(name, spark)[1].transform(df)
    pdf = to_pandas(df)
    snapshot = _pandas_rows(pdf)
    _assert_same_rows(fit_stage(case, pdf)[1].transform(pdf)[out.columns], out)
    assert _pandas_rows(pdf) == snapshot  # the input unchanged


def _cells(row) -> tuple:
    """A row's normalised cells, a missing scalar as None: pandas holds a missing value of any scalar column as
    NaN/NaT (the kernels' own convention), so scalars compare with null and NaN as one "missing"; arrays keep
    their NaN elements."""
    return tuple(None if not isinstance(v, tuple) and v in ("nan", pd.NaT) else v for v in map(_norm, row))


def _assert_same_rows(result: pd.DataFrame, out) -> None:
    """The pandas frame ``result`` holds the rows of ``out`` (a Spark DataFrame, or its collected rows), in
    any order."""
    got = sorted((_cells(r) for r in result.itertuples(index=False)), key=repr)
    want = sorted((_cells(r) for r in (out if isinstance(out, list) else out.collect())), key=repr)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert _same(g, w), f"pandas row {g!r:.300}\n != Spark row {w!r:.300}"


#: The cases whose stage (or fitted model) is one batch kernel: serving, LIME and fuse run it without Spark.
WITH_KERNEL = {"TorchModel", "ONNXModel", "TorchModelSequences", "ONNXModelSequences", "TorchEstimator", "ImageDecoder",
               "ImageTransformer", "UnrollImage", "ImageFeaturizer", "FusedStages", "ImageLIME", "TabularLIME",
               "ImageClassifierModel", "ImageClassifier", "TextEmbedder", "TextClassifierModel", "TextTokenizer",
               "TextLIME", "TextClassifier"}


def _kernel_rows(kernel, pdf: pd.DataFrame) -> list[tuple]:
    """The kernel's output rows on the frame's input columns, as blocks are made without Spark."""
    from irbis.kernels.blocks import block_to_rows, rows_in

    out = kernel.fn({c: rows_in(pdf[c].tolist(), c, c in kernel.ragged) for c in kernel.inputs})
    return list(zip(*[[_norm(v) for v in block_to_rows(out[c])] for c in kernel.outputs]))


@pytest.mark.spark
@CLASSIC_COVERS_CONNECT
@pytest.mark.parametrize("name", NAMES)
def test_kernel_and_load_local_give_the_spark_results(spark, tmp_path, name):
    """Every stage answers kernel(): its kernel (and the one load_local reads from the saved stage, with no
    JVM) gives Spark's rows on the same input, declares the kinds of each input and the type of each
    output; a stage without one raises NoKernelError naming its class, and so does load_local."""
    from irbis.errors import NoKernelError
    from irbis.kernels.chain import KINDS
    from irbis.ml import load_local

    case = STAGE_CASES[name]
    df = case.make_frame(spark)
    model = fitted(name, spark)[1]
    model.save(str(tmp_path / "model"))
    cls = type(model).__name__
    if name not in WITH_KERNEL:
        for answer in (model.kernel, lambda: load_local(str(tmp_path / "model"))):
            with pytest.raises(NoKernelError, match=cls) as info:
                answer()
            assert info.value.classes == [cls]
        return
    kernel, saved = model.kernel(), load_local(str(tmp_path / "model"))
    assert len(saved) == 1 and saved[0].inputs == kernel.inputs and saved[0].kinds == kernel.kinds
    assert kernel.types == saved[0].types == dict(model._output_columns())
    assert all(kernel.kinds[c] and kernel.kinds[c] <= set(KINDS) for c in kernel.inputs)
    want = [tuple(_norm(v) for v in r) for r in model.transform(df).select(*kernel.outputs).collect()]
    pdf = to_pandas(df)
    for got in (_kernel_rows(kernel, pdf), _kernel_rows(saved[0], pdf)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert _same(g, w), f"kernel row {g!r:.300}\n != Spark row {w!r:.300}"


def _same(a: object, b: object) -> bool:
    """Equal, floats within float32 round-off (networks run on other batch sizes in each path)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5)
    if hasattr(a, "to_pydatetime"):
        a = a.to_pydatetime()
    return a == b


# -- generated inputs ----------------------------------------------------------------------------
LONG = "ab " * 4000
TEXT = st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["", "東京 Ünï", LONG, "a b a"]))


def _vector(size: int):
    values = st.lists(st.floats(-1e3, 1e3) | st.just(float("nan")), min_size=size, max_size=size)
    return st.one_of(st.none(), values.map(Vectors.dense), values.map(lambda v: Vectors.dense(v).toArray()).map(
        lambda a: Vectors.sparse(len(a), {i: x for i, x in enumerate(a) if x != 0 and i % 2 == 0})))


def _value(dtype, size: int):
    if isinstance(dtype, StringType):
        return TEXT
    if isinstance(dtype, DoubleType):
        return st.one_of(st.none(), st.just(float("nan")), st.floats(-1e6, 1e6))
    if isinstance(dtype, IntegerType):
        return st.one_of(st.none(), st.integers(-1000, 1000))
    if isinstance(dtype, BooleanType):
        return st.one_of(st.none(), st.booleans())
    if isinstance(dtype, VectorUDT):
        return _vector(size)
    if isinstance(dtype, DateType):
        return st.one_of(st.none(), st.dates(dt.date(1900, 1, 1), dt.date(2100, 1, 1)))
    if isinstance(dtype, TimestampType):
        return st.one_of(st.none(), st.datetimes(dt.datetime(1971, 1, 1), dt.datetime(2100, 1, 1)))
    if isinstance(dtype, ArrayType) and not isinstance(dtype.elementType, StringType):
        # arrays of numbers (e.g. token ids of varying length): elements as the element type generates them
        return st.one_of(st.none(), st.lists(_value(dtype.elementType, size), max_size=6))
    if isinstance(dtype, ArrayType):
        return st.one_of(st.none(), st.lists(TEXT.filter(lambda t: t is not None), max_size=4))
    raise NotImplementedError(f"no generator for {dtype.simpleString()}; extend _value in test_stages.py")


def _sizes(df) -> dict[str, int]:
    sizes = {}
    for field in df.schema.fields:
        if isinstance(field.dataType, VectorUDT):
            first = df.where(F.col(field.name).isNotNull()).select(field.name).first()
            sizes[field.name] = first[0].size if first else 2
    return sizes


@pytest.mark.spark
@CLASSIC_COVERS_CONNECT
@pytest.mark.parametrize("name", [n for n in NAMES if STAGE_CASES[n].generated])
def test_generated_inputs(spark, name):
    """Random small frames of the case's schema (nulls, NaN, unicode, long strings, empty frames and
    partitions, single rows): each input row comes out once with the columns it passes on unchanged, and the
    pandas path gives the Spark rows."""
    case = STAGE_CASES[name]
    template = case.make_frame(spark)
    schema, sizes = template.schema, _sizes(template)
    row = st.tuples(*[_value(f.dataType, sizes.get(f.name, 0)) for f in schema.fields])

    # no shrinking: each example is a Spark job, and a failure shows its (small) example as found
    @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(rows=st.lists(row, min_size=0, max_size=5))
    def check(rows):
        df = spark.createDataFrame(rows, schema).repartition(3)
        _, model = fit_stage(case, df)
        out = model.transform(df)
        try:
            out_rows = out.collect()
        except Exception as err:  # an input the stage cannot take: refused with an error naming its column
            assert any(repr(c) in str(err) for c in schema.names), f"the error names no column: {err}"
            return
        kept = [c for c in schema.names if c in out.columns]  # the input columns the output passes on
        made = [c for c in out.columns if c not in kept]

        def project(columns: list[str]) -> list[tuple]:
            return [tuple(r[c] for c in columns) for r in out_rows]

        if case.keeps_rows:  # every input row comes out once, with the columns it passes on unchanged
            assert len(out_rows) == len(rows)
            assert sorted((tuple(map(_norm, r)) for r in project(kept)), key=repr) == rows_of(df.select(*kept))
        if case.pandas:  # the pandas path gives Spark's rows on the same odd input, in the columns it makes
            result = model.transform(to_pandas(df))  # (pandas holds a null inside an array as NaN)
            assert not case.keeps_rows or len(result) == len(rows)
            if made:
                _assert_same_rows(result[made], project(made))

    check()


# -- column names that SQL text would misread ----------------------------------------------------------
def odd_name(name: str) -> str:
    """A column name holding a dot, a space and a backtick."""
    return f"{name}.v 1`q"


def _renamed(stage, columns: list[str]):
    """``stage`` with every column it names renamed by :func:`odd_name` (frame columns, and any *Col Param)."""
    for param, value in stage.extractParamMap().items():
        named = param.name.endswith(("Col", "Cols"))
        if isinstance(value, str) and value and (value in columns or named):
            stage._set(**{param.name: odd_name(value)})
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value) \
                and (named or all(v in columns for v in value)):
            stage._set(**{param.name: [odd_name(v) for v in value]})
    return stage


@pytest.mark.spark
@pytest.mark.parametrize("name", [n for n in NAMES if STAGE_CASES[n].renamable])
def test_column_names_with_dots_spaces_and_backticks(spark, name):
    """The same rows when every column name holds a dot, a space and a backtick."""
    case = STAGE_CASES[name]
    df = case.make_frame(spark)
    expected = rows_of(fitted(name, spark)[1].transform(df))
    odd = df.toDF(*[odd_name(c) for c in df.columns])
    stage = _renamed(case.make_stage(), df.columns)
    model = stage.fit(odd) if isinstance(stage, Estimator) else stage
    assert rows_of(model.transform(odd)) == expected


# -- schema errors -------------------------------------------------------------------------------
def _expect_error_naming(case: StageCase, df, column: str) -> None:
    with pytest.raises(SCHEMA_ERRORS) as info:
        _, model = fit_stage(case, df)
        model.transform(df)
    assert column in str(info.value), f"the error does not name {column!r}: {info.value}"


@pytest.mark.spark
@pytest.mark.parametrize("name", [n for n in NAMES if STAGE_CASES[n].input_col])
def test_missing_column_is_named(spark, name):
    case = STAGE_CASES[name]
    _expect_error_naming(case, case.make_frame(spark).drop(case.input_col), case.input_col)


@pytest.mark.spark
@pytest.mark.parametrize("name", [n for n in NAMES if STAGE_CASES[n].wrong_type])
def test_wrong_type_is_named(spark, name):
    case = STAGE_CASES[name]
    df = case.make_frame(spark).withColumn(case.input_col, F.lit(None).cast(case.wrong_type))
    _expect_error_naming(case, df, case.input_col)


# -- Spark Connect -------------------------------------------------------------------------------
@pytest.mark.spark
@pytest.mark.parametrize("name", NAMES)
def test_connect_gives_the_classic_results(spark, connect, name):
    """The same stage on a Spark Connect session gives the same rows as on classic Spark."""
    from connect_mode import connect_mode
    from irbis.spark.session import ClassicOnlyError

    case = STAGE_CASES[name]
    if not case.connect:
        with connect_mode(), pytest.raises(ClassicOnlyError, match=type(case.make_stage()).__name__):
            fit_stage(case, case.make_frame(connect))
        return
    expected = rows_of(fitted(name, spark)[1].transform(case.make_frame(spark)))
    with connect_mode():
        remote = case.make_frame(connect)
        assert rows_of(fit_stage(case, remote)[1].transform(remote)) == expected
