"""Training never fails silently: non-finite losses, losses that explode, and rows that are not finite.

:class:`LossWatch` follows one worker's loss through an epoch on the device, without a host sync per
step; at the end of the epoch the loop all-reduces what it saw (:meth:`LossWatch.stats`), so every rank
takes the same decision: stop with a :class:`~irbis.errors.NonFiniteLossError` naming the epoch, the
first bad step and the rows with NaN or infinite values, or note in the summary a loss that grew by
orders of magnitude.
"""

from __future__ import annotations

from typing import Any

import torch

from irbis.errors import NonFiniteLossError, with_fields

#: What the loop does with rows whose features or label are not finite: stop naming them, or drop them.
NAN_POLICIES = ("error", "skip")
#: An epoch whose last step's loss is this many times its first step's is reported in the summary.
GROWTH_WARNING = 100.0


class LossWatch:
    """One epoch's first step with a non-finite loss (0: none) and the loss of its first and last steps."""

    def __init__(self, device: Any) -> None:
        self.bad_step = torch.zeros((), dtype=torch.int64, device=device)
        self.ends = torch.zeros(2, dtype=torch.float64, device=device)
        self.steps = 0

    def see(self, step: int, loss: torch.Tensor) -> None:
        """Record the loss of ``step`` (counted from 1 in the epoch); no host sync."""
        self.bad_step = torch.where((self.bad_step == 0) & ~torch.isfinite(loss), step, self.bad_step)
        if self.steps == 0:
            self.ends[0] = loss
        self.ends[1] = loss
        self.steps += 1

    def stats(self) -> list[float]:
        """``[first loss, last loss, 1.0 if a loss was not finite]``, to be summed over the ranks."""
        return [*self.ends.cpu().tolist(), float(int(self.bad_step) > 0)]


def growth_warning(first: float, last: float, epoch: int, learning_rate: float, world: int) -> str | None:
    """The summary's warning when the epoch's last loss is :data:`GROWTH_WARNING` times its first."""
    if not (first > 0 and last > GROWTH_WARNING * first):
        return None
    return (f"the loss grew from {first / world:.4g} to {last / world:.4g} during epoch {epoch}; the learning "
            f"rate ({learning_rate:g}) may be too high")


def non_finite_error(comm: Any, watch: LossWatch, rows: int, epoch: int, steps_per_epoch: int,
                     learning_rate: float) -> NonFiniteLossError:
    """The error every rank raises alike (one all-gather): first bad step, and the non-finite rows (``rows``:
    this worker's training rows with a non-finite feature or label)."""
    found = [t.tolist() for t in comm.all_gather(torch.tensor([float(watch.bad_step), float(rows)],
                                                              dtype=torch.float64))]
    step = int(min(b for b, _ in found if b > 0))
    nonfinite = int(sum(r for _, r in found))
    hint = (" (drop them, or set nanPolicy='skip')" if nonfinite
            else f" (learningRate={learning_rate:g} may be too high)")
    return with_fields(NonFiniteLossError(  # type: ignore[return-value]
        f"the training loss became NaN or infinite at epoch {epoch}, step {step} of {steps_per_epoch}; "
        f"{nonfinite} training rows have non-finite features or labels" + hint),
        epoch=epoch, step=step, nonFiniteRows=nonfinite)


__all__ = ["GROWTH_WARNING", "NAN_POLICIES", "LossWatch", "growth_warning", "non_finite_error"]
