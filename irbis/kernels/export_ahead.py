"""A network's ONNX export written ahead of a job, in a child process.

A driver that shares the machine's cache with its Python workers (a local master) starts the export
when a job starts, so that the job's workers load the finished file instead of one of them exporting it
while the others wait. The export runs in a fresh interpreter, not in a thread of the driver:
``torch.export`` patches ``torch.nn.Module.__call__`` for the whole process while it traces, which would
change what torch code in the driver's other threads runs meanwhile, and tracing would hold the driver's
GIL for seconds.

The export cache is the only channel between the two. The driver takes the file's lock
(:func:`irbis.kernels.engines.export_lock_path`) before the child starts and hands it over: the child
inherits the locked file and holds the lock until it exits, however it exits. A worker that starts
meanwhile waits on the lock and loads the finished file, or exports the network itself when the child
failed (and meets, and handles, the same error). The child reads its standard input, which the driver
never writes, and leaves when it closes: when the driver exits or dies, the child goes too.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

from irbis.kernels.engines import EngineError, candidates, export_lock_path, exported_engine, onnx_path
from irbis.kernels.engines.exported import export_key
from irbis.kernels.inference import Layers, source_identity

_LOG = logging.getLogger("irbis.inference")


class ExportAhead:
    """The child process writing one export: :meth:`wait` for its file.

    A daemon thread of the driver waits for the child (it runs no torch) and logs a failure as a warning
    with the child's reason, which :meth:`wait` raises as :class:`EngineError`.
    """

    def __init__(self, process: subprocess.Popen, path: Path) -> None:
        self.process, self.path = process, path
        self.error: str | None = None
        self._done = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name="irbis-export-ahead").start()

    def _watch(self) -> None:
        said = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
        code = self.process.wait()
        if code != 0:
            lines = [line for line in said.splitlines() if line.strip()]
            self.error = lines[-1] if lines else f"the export process ended with exit code {code}"
            _LOG.warning("exporting the network ahead of the job failed (%s); a worker will export it and "
                         "report the error", self.error)
        if self.process.stdin:
            self.process.stdin.close()
        self._done.set()

    def running(self) -> bool:
        """Whether the child is still writing the file."""
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> Path:
        """The written file, once the child is done; :class:`EngineError` with its reason when it failed,
        ``TimeoutError`` when it is still running after ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the export ahead of the job is still running after {timeout} s")
        if self.error is not None:
            raise EngineError(f"the export ahead of the job failed: {self.error}")
        return self.path


def export_ahead(source: dict[str, Any], input_shape: list[int] | tuple[int, ...], *, output_layer: Layers = None,
                 device: str = "cpu", precision: str = "fp32", engine: str = "auto",
                 allow_pickle: bool = False) -> ExportAhead | None:
    """Start writing, in a child process, the ONNX export that the workers' first engine will need; None
    where there is nothing to write (eager torch first, the file written, or another process writing it).

    The lock of the file is taken here, before this returns, so the workers of a job started next wait
    for the file rather than export it themselves.
    """
    names = candidates(engine, device, precision)
    if not names or exported_engine(names[0], precision) is None:
        return None
    layer = (tuple(output_layer) if output_layer and not isinstance(output_layer, str)
             else cast(str | None, output_layer))
    shape = tuple(int(d) for d in input_shape)
    path = onnx_path(export_key(source_identity(source), layer, shape))
    job = {"source": source, "layer": layer, "shape": shape, "allow_pickle": allow_pickle, "path": str(path)}
    try:
        lock = None if path.exists() else _try_lock(export_lock_path(path))
        if lock is None:
            return None
        try:
            if path.exists():  # written between the first look and the lock
                return None
            process = _spawn(job, lock)
        finally:
            os.close(lock)  # the child's copy of the locked file keeps the lock
    except OSError as err:  # a cache folder it cannot write, no process to spare: the workers export as before
        _LOG.warning("cannot export the network ahead of the job (%s); a worker will export it", err)
        return None
    return ExportAhead(process, path)


def _spawn(job: dict[str, Any], lock: int) -> subprocess.Popen:
    """A fresh interpreter running :func:`main` on ``job``, holding a copy of the locked descriptor ``lock``,
    with this interpreter's module path (a network class named by reference imports there as here)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.Popen([sys.executable, "-m", __name__, json.dumps(job)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(lock,), env=env)


def _try_lock(lock_path: Path) -> int | None:
    """An open descriptor of ``lock_path`` holding its exclusive lock; None when another process holds it."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _leave_with_parent() -> None:
    """Block on standard input, which the driver never writes; end this process when it closes.

    It reads the descriptor, not ``sys.stdin``, whose buffer lock a daemon thread would hold at the
    interpreter's shutdown."""
    while os.read(0, 4096):
        pass
    os._exit(1)


def main(job: dict[str, Any]) -> int:
    """The child: write the file ``job`` names, under the lock it inherited; report a failure on stderr."""
    threading.Thread(target=_leave_with_parent, daemon=True).start()
    from irbis.kernels.engines.export import write_onnx
    from irbis.kernels.inference import _load_for_export

    layer = tuple(job["layer"]) if isinstance(job["layer"], list) else job["layer"]
    path = Path(job["path"])
    try:
        if not path.exists():
            write_onnx(_load_for_export(job["source"], job["allow_pickle"], layer), layer, tuple(job["shape"]), path)
    except Exception as err:  # noqa: BLE001 - reported to the driver, whose workers meet it too
        message = (str(err).strip().splitlines() or [""])[0][:500]
        print(f"{type(err).__name__}: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
