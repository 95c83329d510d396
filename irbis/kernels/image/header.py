"""Read image dimensions from a file header without decoding the pixels.

Checking ``height * width`` against a limit before the decoder allocates the
full image stops decompression bombs: a few hundred bytes of PNG or JPEG can
declare a 60000 x 60000 picture.  The parsers below cover the formats OpenCV
reads most often (JPEG, PNG, BMP, GIF, WebP, TIFF, PNM).  For any other
format :func:`header_size` returns ``None`` and the caller checks the size
after decoding (OpenCV itself refuses more than ``2**30`` pixels).
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

__all__ = ["header_size", "sniff_format"]

_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_JPEG_NO_LENGTH = {0x01, 0xD8} | set(range(0xD0, 0xD8))


def sniff_format(data: bytes | bytearray | memoryview) -> str | None:
    """Name the container format from its magic bytes, or ``None`` if unknown."""
    head = bytes(data[:16])
    if head.startswith(b"\xff\xd8"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"BM"):
        return "bmp"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return "tiff"
    if len(head) >= 2 and head[0:1] == b"P" and head[1:2] in b"123456":
        return "pnm"
    return None


def _jpeg(data: bytes) -> tuple[int, int] | None:
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            return None
        marker = data[pos]
        pos += 1
        if marker in _JPEG_NO_LENGTH:
            continue
        if marker == 0xDA or pos + 2 > n:  # start of scan before any frame header
            return None
        (length,) = struct.unpack_from(">H", data, pos)
        if marker in _JPEG_SOF:
            if pos + 7 > n:
                return None
            height, width = struct.unpack_from(">HH", data, pos + 3)
            return height, width
        pos += length
    return None


def _png(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    return height, width


def _bmp(data: bytes) -> tuple[int, int] | None:
    if len(data) < 26:
        return None
    (header_len,) = struct.unpack_from("<I", data, 14)
    if header_len == 12:
        width, height = struct.unpack_from("<HH", data, 18)
    else:
        width, height = struct.unpack_from("<ii", data, 18)
    return abs(height), abs(width)


def _gif(data: bytes) -> tuple[int, int] | None:
    if len(data) < 10:
        return None
    width, height = struct.unpack_from("<HH", data, 6)
    return height, width


def _webp(data: bytes) -> tuple[int, int] | None:
    if len(data) < 30:
        return None
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", data, 26)
        return height & 0x3FFF, width & 0x3FFF
    if chunk == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return height, width
    return None


def _tiff(data: bytes) -> tuple[int, int] | None:
    order = "<" if data[:2] == b"II" else ">"
    try:
        (ifd,) = struct.unpack_from(order + "I", data, 4)
        (count,) = struct.unpack_from(order + "H", data, ifd)
        found: dict[int, int] = {}
        for i in range(count):
            tag, kind, _, value = struct.unpack_from(order + "HHI4s", data, ifd + 2 + 12 * i)
            if tag in (256, 257):
                fmt = order + ("H" if kind == 3 else "I")
                found[tag] = struct.unpack_from(fmt, value)[0]
    except struct.error:
        return None
    if 256 in found and 257 in found:
        return found[257], found[256]
    return None


def _pnm(data: bytes) -> tuple[int, int] | None:
    tokens: list[bytes] = []
    for line in bytes(data[:1024]).splitlines():
        tokens += line.split(b"#", 1)[0].split()
        if len(tokens) >= 3:
            break
    try:
        return int(tokens[2]), int(tokens[1])
    except (IndexError, ValueError):
        return None


_PARSERS: dict[str, Callable[[Any], tuple[int, int] | None]] = {"jpeg": _jpeg, "png": _png, "bmp": _bmp, "gif": _gif,
            "webp": _webp, "tiff": _tiff, "pnm": _pnm}


def header_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """Return ``(height, width)`` declared in an image header, or ``None``.

    Parameters
    ----------
    data : bytes
        The encoded file (only the first kilobytes are read, except JPEG,
        whose frame header may follow large metadata segments).

    Returns
    -------
    tuple of int or None
        The declared size; ``None`` when the format is unknown or the header
        is malformed (the decoder will then report the problem).
    """
    fmt = sniff_format(data)
    if fmt is None:
        return None
    return _PARSERS[fmt](data)
