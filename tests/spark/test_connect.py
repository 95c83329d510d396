"""Spark Connect: images, fused stages and the classic-only features' errors on an sc:// session."""
from __future__ import annotations

import pytest

from conftest import connect_mode

pytestmark = pytest.mark.spark


def _rows(df):
    return sorted((r.path, r.error, None if r.image is None else (r.image.height, r.image.width, bytes(r.image.data)))
                  for r in df.collect())


def test_read_images_on_connect_equals_classic(spark, connect, tiny_images, tmp_path):
    from irbis.spark.images import read_images

    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    paths = [str(p) for p in tiny_images.values()] + [str(tmp_path / "broken.jpg")]
    expected = _rows(read_images(paths, spark=spark))
    with connect_mode():
        found = _rows(read_images(paths, spark=connect))
    assert found == expected and sum(r[1] is not None for r in found) == 1


def test_fused_pipeline_on_connect(spark, connect, tiny_images):
    import numpy as np
    import torch

    from irbis.ml import ImageTransformer, TorchModel, fuse
    from irbis.spark.images import read_images

    torch.manual_seed(0)
    small = ImageTransformer(inputCol="image", outputCol="small").resize(16, 16).colorFormat("RGB")
    net = TorchModel.from_module(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(768, 3)),
                                 inputCol="small", outputCol="scores", inputShape=[3, 16, 16])
    model = fuse([small, net])
    paths = [str(p) for p in tiny_images.values()]
    expected = {r.path: r.scores.toArray() for r in model.transform(read_images(paths, spark=spark)).collect()}
    with connect_mode():
        found = {r.path: r.scores.toArray()
                 for r in model.transform(read_images(paths, spark=connect)).collect()}
    assert found.keys() == expected.keys()
    for path, scores in expected.items():
        np.testing.assert_allclose(found[path], scores, rtol=1e-5, atol=1e-6)


def test_classic_only_features_say_so(connect):
    from irbis.spark.images import ImageReadStats
    from irbis.spark.session import ClassicOnlyError, is_connect

    with connect_mode():
        assert is_connect(connect) and is_connect(connect.range(1))
        with pytest.raises(ClassicOnlyError, match="ImageReadStats needs accumulators"):
            ImageReadStats(connect)
