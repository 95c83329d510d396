"""Decoding, header parsing and the Spark image struct (no JVM)."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from irbis.kernels.image.decode import (
    ImageDecodeError,
    array_to_struct,
    decode_batch,
    decode_image,
    ocv_mode,
    struct_to_array,
)
from irbis.kernels.image.header import header_size, sniff_format

CAT_BGR = np.ascontiguousarray(skdata.chelsea()[:, :, ::-1])  # 300x451x3


def encode(img: np.ndarray, ext: str, *params: int) -> bytes:
    ok, buf = cv2.imencode(ext, img, list(params))
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".tiff", ".webp", ".gif", ".ppm"])
def test_header_size_matches_decoded_size(ext):
    if ext == ".gif" and not cv2.haveImageWriter("x.gif"):
        pytest.skip("this OpenCV build cannot write GIF")
    data = encode(CAT_BGR, ext)
    assert sniff_format(data) is not None
    assert header_size(data) == (300, 451)
    assert decode_image(data).shape == (300, 451, 3)


def test_progressive_jpeg_and_webp_lossless_headers():
    assert header_size(encode(CAT_BGR, ".jpg", cv2.IMWRITE_JPEG_PROGRESSIVE, 1)) == (300, 451)
    assert header_size(encode(CAT_BGR, ".webp", cv2.IMWRITE_WEBP_QUALITY, 101)) == (300, 451)


def test_lossless_formats_round_trip_exact_pixels():
    for ext in (".png", ".bmp", ".tiff"):
        np.testing.assert_array_equal(decode_image(encode(CAT_BGR, ext)), CAT_BGR)


def test_grey_alpha_and_16_bit_keep_channels_and_depth():
    grey = skdata.camera()
    out = decode_image(encode(grey, ".png"))
    assert out.shape == grey.shape + (1,) and out.dtype == np.uint8
    bgra = np.dstack([CAT_BGR, np.full(CAT_BGR.shape[:2], 7, np.uint8)])
    np.testing.assert_array_equal(decode_image(encode(bgra, ".png")), bgra)
    deep = (CAT_BGR.astype(np.uint16) * 257)
    out16 = decode_image(encode(deep, ".png"))
    assert out16.dtype == np.uint16
    np.testing.assert_array_equal(out16, deep)


def test_struct_round_trip_and_modes():
    for img, mode in [(CAT_BGR, 16), (CAT_BGR[:, :, :1], 0), (CAT_BGR.astype(np.uint16), 18),
                      (CAT_BGR.astype(np.float32), 21)]:
        struct = array_to_struct(img, origin="file:/x.png")
        assert struct["mode"] == mode == ocv_mode(img.dtype, img.shape[2])
        assert (struct["height"], struct["width"], struct["nChannels"]) == img.shape
        np.testing.assert_array_equal(struct_to_array(struct), img)


def test_struct_with_wrong_length_or_mode_is_refused():
    struct = array_to_struct(CAT_BGR[:4, :4])
    with pytest.raises(ValueError, match="bytes, expected 48"):
        struct_to_array({**struct, "data": struct["data"][:-1]})
    with pytest.raises(ValueError, match="mode 24 does not match nChannels 3"):
        struct_to_array({**struct, "mode": 24})
    with pytest.raises(TypeError, match="no OpenCV type"):
        ocv_mode(np.complex64, 3)


def test_bad_inputs_give_readable_errors():
    jpeg = encode(CAT_BGR, ".jpg")
    cases = {
        b"": "0 bytes",
        jpeg[: len(jpeg) // 2]: "corrupt or truncated jpeg",
        b"hello, I am a text file\n" * 10: "unknown format, not an image",
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 40: "corrupt or truncated png",
    }
    for data, message in cases.items():
        with pytest.raises(ImageDecodeError, match=message):
            decode_image(data)


def test_pixel_limit_checked_from_header_before_decoding():
    # A PNG header declaring 60000 x 60000 followed by nothing: refused by size,
    # not by a failed (huge) decode.
    big = bytearray(encode(np.zeros((2, 2, 3), np.uint8), ".png"))
    big[16:24] = (60000).to_bytes(4, "big") * 2
    with pytest.raises(ImageDecodeError, match="60000x60000 = 3600000000 pixels, over the limit"):
        decode_image(bytes(big))
    with pytest.raises(ImageDecodeError, match="over the limit of 1000"):
        decode_image(encode(CAT_BGR, ".jpg"), max_pixels=1000)
    assert decode_image(encode(CAT_BGR, ".jpg"), max_pixels=None).shape == (300, 451, 3)


def test_decode_batch_never_raises_and_keeps_order():
    good = encode(CAT_BGR, ".png")
    images, errors = decode_batch([good, b"", None, memoryview(good)], max_pixels=10**6)
    assert [i is None for i in images] == [False, True, True, False]
    assert errors[0] is None and "0 bytes" in errors[1] and errors[2] is None and errors[3] is None
    np.testing.assert_array_equal(images[0], CAT_BGR)
    np.testing.assert_array_equal(images[3], CAT_BGR)
