"""The held-out report of an advice: how the advised list and the lists in use do on the steps that
chose it and on later steps it never saw (``bucket_holdout``). Its own module so that ``Advice`` can
carry one without the advisor importing the held-out search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["HeldOut"]


@dataclass(frozen=True)
class HeldOut:
    """How the advice and the lists in use do on the training part and on the held-out part."""

    grid: int  # buckets are multiples of this (1: any size)
    train_steps: int
    held_steps: int
    fitted: tuple[int, ...]  # the list chosen on the training part alone
    advice_train: float  # cost ÷ ideal of ``fitted`` on the training part
    advice_held: float  # ... and on the held-out part: the generalisation estimate
    now_train: Optional[float]  # the lists in use, same two parts; None when no list is known
    now_held: Optional[float]
    by_grid: tuple[tuple[int, float], ...]  # (grid, held-out cost ÷ ideal) for every grid tried

    @property
    def gain(self) -> Optional[float]:
        """The held-out step cost the advice saves over the lists in use, as a fraction (0.2: 20 %)."""
        if self.now_held is None or not self.now_held:
            return None
        return 1.0 - self.advice_held / self.now_held
