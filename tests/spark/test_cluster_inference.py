"""TorchModel on two real executor JVMs (local-cluster): the network file is shipped and results match."""

import numpy as np
import pytest
import torch

from irbis import TorchModel

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_torch_model_on_two_executors(cluster_spark):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).eval()
    x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    df = cluster_spark.createDataFrame([(i, row.tolist()) for i, row in enumerate(x)], "id int, x array<float>")
    stage = TorchModel.from_module(net, inputCol="x", outputCol="y")   # TorchScript: shipped with addFile
    out = stage.transform(df.repartition(4))
    rows = {r.id: r.y.toArray() for r in out.select("id", "y").collect()}
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.stack([rows[i] for i in range(64)]), expected, rtol=1e-5, atol=1e-5)
    # The driver and two executors took part.
    assert cluster_spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() == 3
