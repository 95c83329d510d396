"""Resolve weight URIs to verified local files: downloads are cached, atomic, checksummed and locked.

A download goes to a temporary file in the cache folder, is hashed while written, fsynced and renamed
into place with ``os.replace``, so readers never see a partial file. An exclusive ``fcntl`` lock per
cache entry makes concurrent fetches of the same model (several Spark workers, say) download it once.
Local and ``pkg://`` files are verified in place; a digest is remembered per (path, mtime, size), so a
large file is hashed once per process, not on every call.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from irbis.extras import extra_of
from irbis.models.weights import sha256_file

_VERIFIED: dict[tuple[str, int, int], str] = {}


class ChecksumMismatchError(ValueError):
    """A file's sha256 differs from the catalogue's."""


def default_cache_dir() -> Path:
    """``$IRBIS_HOME/models`` if ``IRBIS_HOME`` is set, else ``~/.cache/irbis/models``."""
    home = os.environ.get("IRBIS_HOME")
    return Path(home) / "models" if home else Path.home() / ".cache" / "irbis" / "models"


def cached_sha256(path: Path) -> str:
    """sha256 of ``path``, remembered per (resolved path, mtime, size)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _VERIFIED:
        _VERIFIED[key] = sha256_file(path)
    return _VERIFIED[key]


def verify_file(path: Path, sha256: str, origin: str) -> None:
    """Raise :class:`ChecksumMismatchError` naming both digests unless ``path`` hashes to ``sha256``."""
    found = cached_sha256(path)
    if found != sha256.lower():
        raise ChecksumMismatchError(f"checksum mismatch for {origin} ({path}): expected sha256 {sha256}, "
                                    f"found {found}; the file is corrupt or not the one the catalogue names")


def resolve_uri(uri: str, base: str | None = None) -> str | Path:
    """A local ``Path`` for file, relative and ``pkg://`` URIs; the absolute URL (str) for http(s)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme in ("http", "https"):
        return uri
    if parts.scheme == "pkg":
        return _package_file(parts.netloc, parts.path.lstrip("/"), uri)
    if parts.scheme == "file":
        return Path(urllib.request.url2pathname(parts.path))
    if parts.scheme:
        raise ValueError(f"unsupported URI scheme {parts.scheme!r} in {uri!r}; use file://, http(s)://, pkg:// "
                         f"or a path")
    if base is not None and not os.path.isabs(uri):
        if urllib.parse.urlsplit(base).scheme in ("http", "https"):
            return urllib.parse.urljoin(base if base.endswith("/") else base.rsplit("/", 1)[0] + "/", uri)
        return Path(base) / uri
    return Path(uri)


def _package_file(package: str, relative: str, uri: str) -> Path:
    try:
        root = resources.files(package)
    except ModuleNotFoundError as e:
        extra = extra_of(package)
        fix = f"pip install 'irbis[{extra}]', which brings it" if extra else \
            "pip install it (its distribution name may use dashes)"
        raise FileNotFoundError(f"{uri}: Python package {package!r} is not installed; {fix}") from e
    target = root.joinpath(relative)
    if not isinstance(target, Path):
        raise ValueError(f"{uri}: package {package!r} is not installed as plain files (zipped?); "
                         f"install it unzipped or copy the file and use a file:// URI")
    return target


@contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on ``lock_path`` (created if needed)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


#: Seconds to wait for a model server to connect or send the next bytes.
DEFAULT_TIMEOUT = 30.0


class ModelDownloadError(OSError):
    """A catalogue or weight file could not be read from its URL (the message names the URL)."""


@contextmanager
def open_url(url: str, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Any]:
    """``urllib.request.urlopen(url)``, whose failures (HTTP status, unreachable host, timeout) raise a
    :class:`ModelDownloadError` naming the URL, with the original error as its cause."""
    import socket
    import urllib.error

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            yield response
    except urllib.error.HTTPError as err:
        raise ModelDownloadError(f"cannot download {url}: the server answered HTTP {err.code} {err.reason}") from err
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as err:
        reason = getattr(err, "reason", err)
        timed_out = isinstance(reason, (socket.timeout, TimeoutError))
        what = f"no answer within {timeout:g} s (the timeout)" if timed_out else f"{reason}"
        raise ModelDownloadError(f"cannot download {url}: {what}") from err


def fetch_url(url: str, dest: Path, sha256: str, timeout: float = DEFAULT_TIMEOUT) -> Path:
    """Download ``url`` to ``dest`` once (under a lock), verified; a cached ``dest`` that no longer
    verifies is removed and downloaded again."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(dest.parent / ".locks" / (dest.name + ".lock")):
        if dest.exists():
            try:
                verify_file(dest, sha256, url)
                return dest
            except ChecksumMismatchError:
                dest.unlink()
        _download(url, dest, sha256, timeout)
    return dest


def _download(url: str, dest: Path, sha256: str, timeout: float) -> None:
    digest = hashlib.sha256()
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as out, open_url(url, timeout) as response:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256.lower():
            raise ChecksumMismatchError(f"checksum mismatch for {url}: expected sha256 {sha256}, found "
                                        f"{digest.hexdigest()}; the download was removed from the cache")


def place_folder(staging: Path, dest: Path) -> Path:
    """Move the complete folder ``staging`` onto ``dest`` (a content-addressed cache entry) in one rename;
    when another process placed ``dest`` first, its copy (the same content) stays and ``staging`` is
    removed. ``staging`` must be on ``dest``'s file system (make it in ``dest.parent``): readers then see
    no entry or a whole one, and concurrent writers of one entry do not fail."""
    try:
        os.rename(staging, dest)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        if err.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not dest.is_dir():
            raise
    return dest


@contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success fsync it and ``os.replace`` it onto ``dest``,
    on error remove it. Readers see the old file or the complete new one, never a partial file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
        dir_fd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)
