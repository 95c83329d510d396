"""Visibility: a driver-side progress bar fed by rank 0, and loss-curve plots.

Rank 0 sends JSON lines to a small TCP listener on the driver, prefixed by a
per-job secret token: a few partial records within each epoch (``step`` of
``stepsPerEpoch``, running loss), then the epoch's full record. Nothing but
JSON is ever parsed. The channel is best effort: if the driver cannot be reached, training goes on
and the summary still comes back with the results.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any


class ProgressServer:
    """Listen for epoch records and show them on a tqdm bar.

    Parameters
    ----------
    epochs : int
        Bar length.
    host : str
        Address the workers can reach the driver at.
    show : bool
        Draw the bar (records are collected either way).
    """

    def __init__(self, epochs: int, host: str = "127.0.0.1", show: bool = True, desc: str = "train") -> None:
        self.token = secrets.token_hex(16)
        self.records: list[dict[str, Any]] = []
        self._sock = socket.create_server((host, 0))
        self.address = (host, self._sock.getsockname()[1])
        self._bar = None
        if show:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=epochs, desc=desc, unit="epoch", leave=True)
        self.position = 0.0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("r", encoding="utf-8") as lines:
            if lines.readline().strip() != self.token:
                return
            for line in lines:
                try:
                    self.update(json.loads(line))
                except (ValueError, TypeError):
                    return

    def update(self, rec: Mapping[str, Any]) -> None:
        """Apply one record to :attr:`position` (epochs done, fractional) and the bar.

        A partial record (with ``step``) moves the bar within its epoch; a full one is
        also kept in :attr:`records`.
        """
        epoch = int(rec.get("epoch", 0))
        partial = "step" in rec
        with self._lock:
            if partial:
                done = int(rec["step"]) / max(int(rec.get("stepsPerEpoch", 1)), 1)
                self.position = max(self.position, epoch - 1 + done)
            else:
                self.records = [r for r in self.records if r.get("epoch") != epoch] + [dict(rec)]
                self.position = max(self.position, float(epoch))
            if self._bar is not None:
                self._bar.n = round(self.position, 2)
                acc = rec.get("accuracy")
                post = {"loss": f"{rec.get('loss', 0):.4f}"}
                if not partial:
                    post.update(acc="-" if acc is None else f"{acc:.3f}",
                                sps=f"{rec.get('samplesPerSecond', 0):,.0f}")
                self._bar.set_postfix(post)

    def close(self) -> None:
        """Stop listening and close the bar."""
        self._sock.close()
        if self._bar is not None:
            self._bar.close()

    def endpoint(self) -> tuple[str, int, str]:
        """``(host, port, token)`` for :class:`ProgressClient`."""
        return self.address[0], self.address[1], self.token


class ProgressClient:
    """Rank 0's end: send epoch records; errors switch the channel off silently."""

    def __init__(self, endpoint: tuple[str, int, str] | None) -> None:
        self._endpoint = endpoint
        self._sock: socket.socket | None = None

    def __call__(self, record: Mapping[str, Any]) -> None:
        if self._endpoint is None:
            return
        host, port, token = self._endpoint
        try:
            if self._sock is None:
                self._sock = socket.create_connection((host, port), timeout=2.0)
                self._sock.sendall(f"{token}\n".encode())
            self._sock.sendall((json.dumps(dict(record)) + "\n").encode())
        except OSError:
            self._endpoint = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()


def plot_loss_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], path: str, key: str = "loss",
                     title: str = "training loss per epoch") -> str:
    """Plot one line per run (e.g. per strategy) of ``key`` against epoch; save to ``path``.

    ``curves`` maps a label to its summary records (as in ``TorchModel.training_summary``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, records in curves.items():
        pts = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), label=label, marker=".")
    ax.set_xlabel("epoch")
    ax.set_ylabel(key)
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
