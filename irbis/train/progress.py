"""Visibility: a driver-side progress bar fed by rank 0, loss-curve plots, and the training summary
(:class:`TrainingSummary`), which shows itself as a table in a notebook.

Rank 0 sends JSON lines to a small TCP listener on the driver, prefixed by a
per-job secret token: a few partial records within each epoch (``step`` of
``stepsPerEpoch``, running loss), then the epoch's full record. Nothing but
JSON is ever parsed. The channel is best effort: if the driver cannot be reached, training goes on
and the summary still comes back with the results.
"""

from __future__ import annotations

import html
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


def _value(record: Mapping[str, Any], key: str) -> Any:
    """``record[key]``, where a dotted ``key`` reads a nested record (``staleness.mean``); None if absent."""
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def draw_loss_curves(ax: Any, curves: Mapping[str, Sequence[Mapping[str, Any]]], key: str = "loss",
                     title: str = "training loss per epoch", log: bool = True) -> Any:
    """Draw one line per run of ``key`` (dotted for a nested value, e.g. ``staleness.mean``) against epoch
    on the matplotlib axes ``ax``; return ``ax``. :func:`plot_loss_curves` and
    :meth:`TrainingSummary.plot` both draw with it."""
    for label, records in curves.items():
        pts = [(r["epoch"], v) for r in records if (v := _value(r, key)) is not None]
        if pts:
            ax.plot(*zip(*pts), label=label, marker=".")
    ax.set_xlabel("epoch")
    ax.set_ylabel(key)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def plot_loss_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], path: str, key: str = "loss",
                     title: str = "training loss per epoch") -> str:
    """Plot one line per run (e.g. per strategy) of ``key`` against epoch; save to ``path``.

    ``curves`` maps a label to its summary records (as in ``TorchModel.training_summary``). The figure is
    drawn off screen (no pyplot), so a notebook's or an application's matplotlib backend is left as it is.
    """
    from irbis.explain.plot import figure

    fig, ax = figure(7, 4.5)
    draw_loss_curves(ax, curves, key, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _flat(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A record's scalar values, nested records flattened with dots (``staleness.mean``); lists left out."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        elif not isinstance(value, (list, tuple)):
            out[f"{prefix}{key}"] = value
    return out


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return html.escape(str(value))


class TrainingSummary(list):
    """A fit's per-epoch records (``training_summary`` of a fitted model): a plain ``list`` of dicts, so it
    compares, iterates and saves as JSON exactly as one, that also shows itself in a notebook as a table
    (one row per epoch, nested values such as ``staleness.mean`` as columns of their own) and draws its
    curves with :meth:`plot`.

    Examples
    --------
    >>> summary = TrainingSummary([{"epoch": 1, "loss": 0.9}, {"epoch": 2, "loss": 0.5}])
    >>> summary == [{"epoch": 1, "loss": 0.9}, {"epoch": 2, "loss": 0.5}]
    True
    >>> summary.columns()
    ['epoch', 'loss']
    >>> ax = summary.plot()                                  # doctest: +SKIP
    """

    def columns(self) -> list[str]:
        """The table's columns: every scalar key of the records (nested ones dotted), in order of first use."""
        seen: dict[str, None] = {}
        for record in self:
            seen.update(dict.fromkeys(_flat(record)))
        return list(seen)

    def _repr_html_(self) -> str:
        columns = self.columns()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        rows = "".join("<tr>" + "".join(f"<td>{_cell(flat.get(c))}</td>" for c in columns) + "</tr>"
                       for flat in map(_flat, self))
        return (f'<table class="irbis-training-summary"><caption>training summary: {len(self)} '
                f'epoch{"" if len(self) == 1 else "s"}</caption><thead><tr>{head}</tr></thead>'
                f"<tbody>{rows}</tbody></table>")

    def plot(self, key: str = "loss", ax: Any = None, title: str | None = None, log: bool | None = None) -> Any:
        """Draw ``key`` per epoch (dotted for a nested value, e.g. ``"staleness.mean"``) with
        :func:`draw_loss_curves`; for ``"loss"`` the validation loss too, when the fit kept a validation
        set. On ``ax`` when given, else on a new pyplot figure (shown inline in a notebook). The y axis is
        logarithmic for losses (``log=None``) and linear otherwise. Returns the axes."""
        if ax is None:
            from irbis.extras import load

            plt = load("matplotlib.pyplot", "explain")
            ax = plt.figure(figsize=(7, 4.5)).add_subplot()
        curves: dict[str, Sequence[Mapping[str, Any]]] = {"training": self}
        if key == "loss" and any(r.get("validationLoss") is not None for r in self):
            curves["validation"] = [{"epoch": r["epoch"], "loss": r.get("validationLoss")} for r in self]
        if log is None:
            log = key.lower().endswith("loss")
        return draw_loss_curves(ax, curves, key, title or f"{key} per epoch", log)


class SummaryAttribute:
    """A fitted model's ``training_summary`` attribute: whatever list of records is set (a fit's history, a
    summary read back from JSON) is kept as a :class:`TrainingSummary`; None stays None."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj.__dict__.get(self._name)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self._name] = None if value is None else TrainingSummary(value)
