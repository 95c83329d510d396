"""What a user sees: a clean console for a normal run, and errors that name the column, path and shape."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from pyspark.ml.linalg import Vectors

from irbis.ml import TorchModel

pytestmark = pytest.mark.spark

MARK = "=== session ready ==="

# A fresh driver, so that its console (its own and its JVM's, which writes to the same file descriptors)
# can be read whole: a TorchEstimator fit, then a transform of the fitted model and of a Featurize model.
NORMAL_RUN = textwrap.dedent(f"""
    from pyspark.ml.linalg import Vectors
    from irbis.ml import Featurize, TorchEstimator
    from irbis.spark.session import get_spark

    spark = get_spark("local[2]", **{{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}})
    df = spark.createDataFrame([(Vectors.dense([float(i % 5), float(i % 2)]), i % 2, f"k{{i % 3}}")
                                for i in range(48)], ["vec", "label", "key"])
    print({MARK!r}, flush=True)
    model = TorchEstimator(network="mlp", networkOptions='{{"in_features": 2, "hidden": 4, "out_features": 2}}',
                           inputCol="vec", epochs=2, batchSize=8, numWorkers=2, showProgress=False).fit(df)
    assert len(model.transform(df).collect()) == 48
    featurized = Featurize(inputCols=["vec", "key"], outputCol="f").fit(df).transform(df)
    assert len(featurized.collect()) == 48
    print("=== run done ===", flush=True)
    spark.stop()
""")

NOISE = ("WARN", "Warning", "warning", "Traceback", "Exception", "\tat ", "ERROR")

#: Warnings Spark prints when the machine is busy, not because of anything Irbis does: (logger, start of the
#: message). A heartbeat or an RPC reply late beyond its timeout, a Python worker gone before its /proc entry
#: was read, a shutdown hook that outlived its grace. Each may come with a stack trace, skipped with it.
SPARK_LOAD_WARNINGS = (
    ("Executor", "Issue communicating with driver in heartbeater"),
    ("Executor", "Told to re-register on heartbeat"),
    ("HeartbeatReceiver", "Removing executor"),
    ("NettyRpcEnv", "Ignored failure:"),
    ("NettyRpcEnv", "Ignored message:"),
    ("TransportResponseHandler", "Ignoring response for RPC"),
    ("ProcfsMetricsGetter", "There was a problem with reading the stat file of the process"),
    ("ShutdownHookManager", "ShutdownHook "),
)
_SPARK_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (?:WARN|ERROR|INFO|DEBUG) (\S+?): (.*)$")
_TRACE_LINE = re.compile(r"^\s+at |^\s*\.\.\. \d+ more|^\s*Caused by: |^\s*Suppressed: |^[\w$.]+(?:Exception|Error)\b")


def _noisy(console: str) -> list[str]:
    """The lines of ``console`` that a user would take for a problem: warnings, errors and stack traces, less
    Spark's start-up lines and the warnings Spark prints under load (:data:`SPARK_LOAD_WARNINGS`), whose stack
    traces go with them."""
    noisy, in_load_warning = [], False
    for line in console.splitlines():
        spark = _SPARK_LINE.match(line)
        if spark is not None:
            in_load_warning = any(spark[1] == name and spark[2].startswith(start)
                                  for name, start in SPARK_LOAD_WARNINGS)
            if in_load_warning:
                continue
        elif in_load_warning and _TRACE_LINE.match(line):
            continue
        else:
            in_load_warning = False
        if any(n in line for n in NOISE) and not _startup_line(line):
            noisy.append(line)
    return noisy


@pytest.mark.classic_only(reason="a fresh driver process with a classic session of its own: it takes no "
                                 "Spark session from the test run")
def test_a_normal_fit_and_transform_print_no_warning_or_stack_trace(tmp_path):
    """Depends on what the run prints, not on the machine's pace: the warnings Spark prints when the machine is
    busy (:data:`SPARK_LOAD_WARNINGS`) are let through, every other warning, error or stack trace fails it
    (``test_the_console_check_lets_through_only_spark_load_warnings`` shows which)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's default filters, as a user has
    run = subprocess.run([sys.executable, "-c", NORMAL_RUN], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    console = run.stdout + run.stderr
    assert run.returncode == 0, console[-3000:]
    after = (run.stdout.split(MARK, 1)[1] + "\n" + run.stderr.split(MARK, 1)[-1]) if MARK in run.stdout else console
    # Spark's own start-up lines come before the mark (stderr is read whole where the JVM printed no mark)
    noisy = _noisy(after)
    assert "=== run done ===" in run.stdout
    assert not noisy, "\n".join(noisy[:20])


def test_the_console_check_lets_through_only_spark_load_warnings():
    """The console check on a made-up console: Spark's load warnings pass with their stack traces; a warning of
    Irbis (its logger's or Python's), a Spark warning Irbis causes (a large task binary) and a traceback fail."""
    load = """26/01/02 10:00:00 WARN Executor: Issue communicating with driver in heartbeater
org.apache.spark.rpc.RpcTimeoutException: Futures timed out after [10000 milliseconds]
	at org.apache.spark.rpc.RpcTimeout.org$apache$spark$rpc$RpcTimeout$$createRpcTimeoutException(RpcTimeout.scala:47)
	... 12 more
Caused by: java.util.concurrent.TimeoutException: Futures timed out after [10000 milliseconds]
	at scala.concurrent.impl.Promise$DefaultPromise.tryAwait0(Promise.scala:248)
26/01/02 10:00:01 WARN NettyRpcEnv: Ignored message: HeartbeatResponse(false)
26/01/02 10:00:02 WARN ProcfsMetricsGetter: There was a problem with reading the stat file of the process. 
=== run done ==="""  # noqa: W291  (the ProcfsMetricsGetter line ends with a space, as Spark prints it)
    assert _noisy(load) == []
    ours = ["26/01/02 10:00:03 WARN DAGScheduler: Broadcasting large task binary with size 1042.3 KiB",
            "WARNING:irbis.ml.estimator:the loss grew",
            "/x/irbis/ml/torch_model.py:12: UserWarning: the batch was copied",
            "Traceback (most recent call last):"]
    for line in ours:
        assert _noisy(load + "\n" + line) == [line]
    trace_after = load + "\nTraceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad"
    assert _noisy(trace_after) == ["Traceback (most recent call last):"]  # not taken for the warning's trace
    assert _noisy("26/01/02 10:00:04 WARN Executor: Managed memory leak detected\n\tat x.y(z.java:1)") == [
        "26/01/02 10:00:04 WARN Executor: Managed memory leak detected", "\tat x.y(z.java:1)"]


def _startup_line(line: str) -> bool:
    """Lines Spark prints while its JVM starts, before any Irbis code runs."""
    return any(s in line for s in ("NativeCodeLoader", "Using incubator modules", "SparkUI", "log4j",
                                   "setLogLevel", "Setting default log level", "Utils: Your hostname",
                                   "Utils: Set SPARK_LOCAL_IP"))


def test_a_missing_image_folder_is_named_without_a_jvm_trace(spark, tmp_path, capfd):
    from irbis.spark.images import read_images

    with pytest.raises(FileNotFoundError, match="read_images: path 'missing_dir' does not exist"):
        read_images(str("missing_dir"), spark=spark)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_images(f"file://{tmp_path}/nothing/here", spark=spark)
    assert "\tat org.apache" not in capfd.readouterr().err
    (tmp_path / "empty").mkdir()
    assert read_images(str(tmp_path / "empty"), spark=spark).count() == 0


def test_a_row_that_does_not_fit_the_network_names_column_and_shapes(spark):
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    model = TorchModel.from_module(net, inputCol="v", outputCol="out")
    assert model.getInputShape() == [4]
    df = spark.createDataFrame([(Vectors.dense([1.0, 2.0, 3.0]),)], ["v"])
    with pytest.raises(Exception, match=r"column 'v': a row has shape \[3\] \(3 values\), but the network "
                                        r"expects shape \[4\]"):
        model.transform(df).collect()


class _NoShapeNet(torch.nn.Module):
    """A network whose input shape cannot be told from its layers."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * 2


def test_an_engine_shape_error_is_turned_into_a_named_one(spark):
    model = TorchModel.from_module(_NoShapeNet(), inputCol="v", outputCol="out")
    df = spark.createDataFrame([(Vectors.dense([1.0, 2.0, 3.0]),)], ["v"])
    with pytest.raises(Exception, match=r"rows of column 'v' have shape \[3\], which the network does not "
                                        r"accept.*mat1 and mat2 shapes cannot be multiplied"):
        model.transform(df).collect()
    ok = spark.createDataFrame([(Vectors.dense([1.0, 2.0, 3.0, 4.0]),)], ["v"])
    assert np.isfinite(model.transform(ok).first()["out"].toArray()).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU (the gpu test runs there)")
def test_cuda_on_a_cpu_local_master_fails_at_transform_on_the_driver(spark):
    from irbis.ml.params import ParamValueError

    model = TorchModel.from_module(torch.nn.Linear(2, 2), inputCol="v", outputCol="out", device="cuda")
    df = spark.createDataFrame([(Vectors.dense([1.0, 2.0]),)], ["v"])
    with pytest.raises(ParamValueError, match="device='cuda'.*no CUDA device"):
        model.transform(df)  # before any job starts


@pytest.mark.gpu
def test_cuda_transform_gives_the_outputs_of_the_cpu(spark):
    """Skipped without a GPU; its path on the CPU: the same stage on a Spark frame against plain PyTorch,
    ``test_torch_model_equals_plain_pytorch_and_keeps_nulls`` in ``tests/spark/test_network_stages.py``; the
    kernel on the run's device against eager torch, ``test_fp32_kernel_on_the_device_gives_the_cpu_answers`` in
    ``tests/unit/kernels/test_device_inference.py``; device='cuda' refused on the driver of a machine without
    one, ``test_cuda_on_a_cpu_local_master_fails_at_transform_on_the_driver`` above. No CPU test runs the network
    on CUDA inside a Spark task."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    df = spark.createDataFrame([(Vectors.dense(v),) for v in np.random.default_rng(0).normal(size=(20, 4))], ["v"])
    out = {device: np.array([r.out.toArray() for r in TorchModel.from_module(
        net, inputCol="v", outputCol="out", device=device).transform(df).collect()]) for device in ("cpu", "cuda")}
    assert out["cuda"].shape == (20, 3)
    np.testing.assert_allclose(out["cuda"], out["cpu"], rtol=1e-3, atol=1e-4)  # TF32 matmuls may round


def test_mini_batch_size_and_precision_fail_when_set():
    from irbis.ml.params import ParamValueError

    with pytest.raises(ParamValueError, match="miniBatchSize=0 is not allowed; expected a number >= 1"):
        TorchModel(miniBatchSize=0)
    with pytest.raises(ParamValueError, match="precision='fp8' is not allowed"):
        TorchModel().setPrecision("fp8")


def test_featurize_takes_dotted_and_spaced_column_names(spark):
    from irbis.ml import Featurize

    data = [(1.0, "x", 2.0), (3.0, "y", None)]
    odd = spark.createDataFrame(data, ["a.b", "c d", "e`f"])
    plain = spark.createDataFrame(data, ["a", "c", "e"])
    got = Featurize(inputCols=["a.b", "c d", "e`f"], outputCol="f", maxCategories=5).fit(odd).transform(odd)
    want = Featurize(inputCols=["a", "c", "e"], outputCol="f", maxCategories=5).fit(plain).transform(plain)
    rows = [r["f"].toArray().tolist() for r in got.orderBy("`a.b`").collect()]
    assert rows == [r["f"].toArray().tolist() for r in want.orderBy("a").collect()]
    assert rows[0][0] == 1.0 and rows[1][0] == 3.0
