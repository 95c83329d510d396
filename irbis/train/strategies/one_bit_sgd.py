"""1-bit SGD with error feedback.

F. Seide, H. Fu, J. Droppo, G. Li, D. Yu, "1-Bit Stochastic Gradient Descent and
its Application to Data-Parallel Distributed Training of Speech DNNs",
Interspeech 2014 (CNTK's ``data_parallel_distributed_learner(num_quantization_bits=1)``).

Each worker adds the quantisation error it kept from the previous step to its
gradient, quantises the result to one bit per value, and keeps the new error:

.. math::
    c   &= g + e                                                       \\\\
    q_j &= \\begin{cases} \\mu^+_j & c_j \\ge 0 \\\\ \\mu^-_j & c_j < 0 \\end{cases} \\\\
    e   &= c - q

where :math:`\\mu^\\pm` are the means of the non-negative and of the negative
values of ``c`` in the value's column: the two reconstruction values that
minimise the squared error of the column. So each column of ``q`` sums to the
same as the column of ``c`` (the error has zero mass per column), and nothing
is lost over time, only delayed. A column is a run of at most ``columnSize``
consecutive values of one parameter tensor (CNTK quantises the columns of
each weight matrix; a fixed height keeps the scale overhead bounded for layers
with few rows, such as a 10-class output layer).

On the wire each worker sends the sign bits packed eight to a byte plus two
float32 scales per column, exchanged by all-gather; every worker then averages
the ``N`` reconstructed gradients in rank order, so replicas stay identical.
For the first ``warmupSteps`` steps gradients are all-reduced unquantised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from irbis.train.strategy import FlatParams, Strategy, WorkerContext

_BIT_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


@dataclass
class State:
    """The per-worker quantisation error carried into the next step."""

    error: torch.Tensor | None = None


def column_ids(sizes: list[int], column_size: int) -> tuple[torch.Tensor, int]:
    """Column index of every value of the flat buffer; columns never span two tensors."""
    ids, start = [], 0
    for n in sizes:
        ids.append(torch.arange(n) // column_size + start)
        start += -(-n // column_size)
    return torch.cat(ids), start


def quantize(c: torch.Tensor, cols: torch.Tensor, ncols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sign bits of ``c`` and the per-column means of its non-negative and negative values."""
    bits = c >= 0
    pos_f = bits.to(c.dtype)
    zeros = torch.zeros(ncols, dtype=c.dtype, device=c.device)
    pos_sum = zeros.index_add(0, cols, c * pos_f)
    neg_sum = zeros.index_add(0, cols, c * (1 - pos_f))
    pos_cnt = zeros.index_add(0, cols, pos_f)
    neg_cnt = zeros.index_add(0, cols, 1 - pos_f)
    return bits, pos_sum / pos_cnt.clamp_min(1), neg_sum / neg_cnt.clamp_min(1)


def dequantize(bits: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Reconstruct ``q`` from the bits and the per-column values."""
    return torch.where(bits, pos[cols], neg[cols])


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack a bool vector into ``ceil(n/8)`` bytes, most significant bit first (as ``np.packbits``)."""
    pad = (-bits.numel()) % 8
    b = torch.nn.functional.pad(bits.to(torch.uint8), (0, pad)).view(-1, 8)
    return (b * _BIT_WEIGHTS.to(b.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``n`` bits as a bool vector."""
    w = _BIT_WEIGHTS.to(packed.device)
    return ((packed.unsqueeze(1) & w) != 0).view(-1)[:n]


def encode(c: torch.Tensor, cols: torch.Tensor, ncols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``c``; return the wire packet (uint8: bits, then scales) and ``q``."""
    bits, pos, neg = quantize(c, cols, ncols)
    scales = torch.cat([pos, neg]).to(torch.float32)
    packet = torch.cat([pack_bits(bits), scales.view(torch.uint8)])
    return packet, dequantize(bits, pos, neg, cols)


def decode(packet: torch.Tensor, n: int, cols: torch.Tensor, ncols: int, dtype: torch.dtype) -> torch.Tensor:
    """Rebuild ``q`` from a packet made by :func:`encode`."""
    nbytes = -(-n // 8)
    scales = packet[nbytes:].clone().view(torch.float32).to(dtype)
    return dequantize(unpack_bits(packet[:nbytes], n), scales[:ncols], scales[ncols:], cols)


def packet_bytes(n: int, ncols: int) -> int:
    """Bytes one worker puts on the wire per step for ``n`` values in ``ncols`` columns."""
    return -(-n // 8) + 8 * ncols


class OneBitSGD(Strategy):
    """1-bit quantised gradients with error feedback, exchanged by all-gather.

    Parameters
    ----------
    columnSize : int, default 512
        Values per column (one pair of float32 scales per column).
    warmupSteps : int, default 0
        Steps of plain all-reduce before quantising (CNTK's ``distributed_after``).

    Examples
    --------
    >>> OneBitSGD(warmupSteps=10)
    OneBitSGD(columnSize=512, warmupSteps=10)
    """

    name = "one_bit"

    def __init__(self, columnSize: int = 512, warmupSteps: int = 0) -> None:
        if not isinstance(columnSize, int) or isinstance(columnSize, bool) or columnSize < 1:
            raise ValueError(f"columnSize must be an int >= 1, found {columnSize!r}")
        if not isinstance(warmupSteps, int) or isinstance(warmupSteps, bool) or warmupSteps < 0:
            raise ValueError(f"warmupSteps must be an int >= 0, found {warmupSteps!r}")
        self.columnSize = columnSize
        self.warmupSteps = warmupSteps
        self.state = State()
        self._cols: torch.Tensor | None = None
        self._ncols = 0

    def options(self) -> dict[str, Any]:
        return {"columnSize": self.columnSize, "warmupSteps": self.warmupSteps}

    def setup(self, flat: FlatParams, ctx: WorkerContext) -> None:
        cols, self._ncols = column_ids([n for _, n in flat.offsets], self.columnSize)
        self._cols = cols.to(flat.grads.device)
        if self.state.error is None:
            self.state.error = torch.zeros_like(flat.grads)

    def reduce_grads(self, flat: FlatParams, ctx: WorkerContext, step: int) -> None:
        if step <= self.warmupSteps:
            ctx.comm.all_reduce_mean(flat.grads)
            return
        error, cols = self.state.error, self._cols
        assert error is not None and cols is not None  # set up by setup()
        c = flat.grads + error
        packet, q = encode(c, cols, self._ncols)
        torch.sub(c, q, out=error)
        packets = ctx.comm.all_gather(packet)
        n = flat.grads.numel()
        total = decode(packets[0], n, cols, self._ncols, flat.grads.dtype)
        for p in packets[1:]:
            total.add_(decode(p, n, cols, self._ncols, flat.grads.dtype))
        flat.grads.copy_(total.div_(len(packets)))

    def state_dict(self) -> dict[str, Any]:
        return {"error": self.state.error}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.error = state["error"].clone()
