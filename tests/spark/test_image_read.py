"""read_images, the streaming folder source and ImageDecoder on real files (few Spark jobs)."""
from __future__ import annotations

from urllib.parse import unquote

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from irbis.kernels.image.decode import struct_to_array
from irbis.ml.image import ImageDecoder
from irbis.spark.images import ImageReadStats, read_images, read_images_stream

pytestmark = pytest.mark.spark

CAT_BGR = np.ascontiguousarray(skdata.chelsea()[:, :, ::-1])
GOOD = {"cat.jpg", "coffee.png", "grey image.png", "deep.png", "alpha.png"}
BAD = {"truncated.jpg": "corrupt or truncated jpeg", "notes.txt": "unknown format, not an image",
       "empty.jpg": "0 bytes", "bomb.png": "over the limit"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    (root / "sub").mkdir()
    cv2.imwrite(str(root / "cat.jpg"), CAT_BGR)
    cv2.imwrite(str(root / "sub" / "coffee.png"), skdata.coffee()[::4, ::4, ::-1])
    (root / "grey image.png").write_bytes(cv2.imencode(".png", skdata.camera()[::8, ::8])[1].tobytes())
    cv2.imwrite(str(root / "deep.png"), CAT_BGR[::4, ::4].astype(np.uint16) * 257)
    cv2.imwrite(str(root / "alpha.png"), np.dstack([CAT_BGR[::4, ::4], np.full((75, 113), 9, np.uint8)]))
    jpeg = (root / "cat.jpg").read_bytes()
    (root / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 3])
    (root / "notes.txt").write_text("not an image\n")
    (root / "empty.jpg").write_bytes(b"")
    bomb = bytearray(cv2.imencode(".png", np.zeros((2, 2, 3), np.uint8))[1].tobytes())
    bomb[16:24] = (50000).to_bytes(4, "big") * 2  # declares 50000 x 50000
    (root / "bomb.png").write_bytes(bytes(bomb))
    return root


def _name(path: str) -> str:
    return unquote(path.rsplit("/", 1)[-1])  # inputFiles() gives URIs ("grey%20image.png")


@pytest.mark.classic_only(reason="ImageReadStats counts with accumulators, which Spark Connect lacks (test_connect "
                                 "checks its error there and reads images on Connect)")
def test_read_images_decodes_every_kind_and_reports_bad_files(spark, folder):
    stats = ImageReadStats(spark)
    rows = {_name(r.path): r for r in read_images(str(folder), stats=stats).collect()}
    assert set(rows) == GOOD | set(BAD)
    for name in GOOD:
        assert rows[name].error is None
        img = rows[name].image
        assert img.origin == rows[name].path
        expected = cv2.imread(str(next(folder.rglob(name))), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(struct_to_array(img.asDict()).squeeze(), expected)
    modes = {n: (rows[n].image.nChannels, rows[n].image.mode) for n in GOOD}
    assert modes == {"cat.jpg": (3, 16), "coffee.png": (3, 16), "grey image.png": (1, 0),
                     "deep.png": (3, 18), "alpha.png": (4, 24)}
    for name, message in BAD.items():
        assert rows[name].image is None and message in rows[name].error, name
    assert (stats.files, stats.bad_files) == (9, 4)


def test_drop_invalid_recursive_and_sample_ratio(spark, folder):
    top_level_good = read_images(str(folder), recursive=False, dropInvalid=True)
    assert top_level_good.count() == len(GOOD) - 1  # coffee.png is in sub/
    sampled = read_images(str(folder), sampleRatio=0.5, seed=3)
    again = read_images(str(folder), sampleRatio=0.5, seed=3)
    names = {_name(p) for p in sampled.inputFiles()}
    assert 0 < len(names) < 9 and names <= GOOD | set(BAD)
    assert set(sampled.inputFiles()) == set(again.inputFiles())
    with pytest.raises(ValueError, match="sampleRatio"):
        read_images(str(folder), sampleRatio=0.0)


def test_streaming_folder_source(spark, folder, tmp_path):
    stream = read_images_stream(str(folder), pathGlobFilter="*.jpg", recursive=False)
    assert stream.isStreaming
    query = (stream.writeStream.format("memory").queryName("irbis_images_stream")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    rows = {_name(r.path): r for r in spark.table("irbis_images_stream").collect()}
    assert set(rows) == {"cat.jpg", "truncated.jpg"}  # Spark's file scan skips the empty file
    assert rows["cat.jpg"].image.height == 300 and "truncated" in rows["truncated.jpg"].error


def test_image_decoder_on_binary_column(spark, folder):
    files = spark.read.format("binaryFile").load(str(folder / "*.*"))
    decoded = ImageDecoder(inputCol="content", originCol="path", maxPixels=10_000).transform(files)
    rows = {_name(r.path): r for r in decoded.select("path", "image", "error").collect()}
    assert rows["cat.jpg"].image is None and "over the limit of 10000" in rows["cat.jpg"].error
    grey = rows["grey image.png"]
    assert grey.error is None and grey.image.origin.endswith("grey image.png")
    np.testing.assert_array_equal(struct_to_array(grey.image.asDict())[:, :, 0],
                                  skdata.camera()[::8, ::8])
    assert rows["notes.txt"].image is None and "not an image" in rows["notes.txt"].error
