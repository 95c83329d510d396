"""A worker's validation pass at the end of an epoch: loss, accuracy and the histograms of the ROC AUC."""

from __future__ import annotations

from typing import Any

import torch

from irbis.train.ragged import forward
from irbis.train.rows import Rows

#: Score bins of the two-class ROC AUC of the validation rows (histograms summed over the workers).
AUC_BINS = 1000


def evaluate(model: torch.nn.Module, loss_fn: Any, rows: Rows, batch_size: int, device: str,
             label_dtype: Any, correct_fn: Any = None) -> tuple[float, float, int, torch.Tensor]:
    """Validation loss·n, correct rows, rows, and the histograms of the positive class's probability of the
    negative and the positive rows (for the AUC; zeros unless the network has two outputs). ``rows`` are
    read by :meth:`~irbis.train.rows.Rows.eval_batches` at ``batch_size``, the model in eval mode (training
    mode after). Class indices count the rows whose top output is the label; other labels count
    ``correct_fn(output, labels)`` when given (the loss's :attr:`~irbis.train.optim.Loss.correct`)."""
    hist = torch.zeros(2, AUC_BINS, dtype=torch.float64)
    if len(rows) == 0:
        return 0.0, 0.0, 0, hist
    loss = correct = 0.0
    n = 0
    model.eval()
    with torch.no_grad():
        for xv, yv in rows.eval_batches(batch_size, device, label_dtype):
            out = forward(model, xv)
            loss += float(loss_fn(out, yv)) * len(yv)
            n += len(yv)
            if correct_fn is not None and yv.dtype != torch.int64:
                correct += float(correct_fn(out, yv))
            elif out.dim() == 2 and yv.dtype == torch.int64:
                correct += float((out.argmax(1) == yv).sum())
                if out.shape[1] == 2:
                    score = torch.softmax(out.float(), 1)[:, 1].cpu()
                    bins = (score * AUC_BINS).long().clamp(0, AUC_BINS - 1)
                    for c in (0, 1):
                        hist[c] += torch.bincount(bins[yv.cpu() == c], minlength=AUC_BINS).double()
    model.train()
    return loss, correct, n, hist


def auc_from_histograms(hist: torch.Tensor) -> float | None:
    """ROC AUC from score histograms of the negative and positive rows (ties within a bin count half)."""
    neg, pos = hist[0], hist[1]
    if neg.sum() == 0 or pos.sum() == 0:
        return None
    below = torch.cumsum(neg, 0) - neg  # negatives in lower bins
    return float(((below + 0.5 * neg) * pos).sum() / (neg.sum() * pos.sum()))


__all__ = ["AUC_BINS", "auc_from_histograms", "evaluate"]
