"""Draft-length policies. They change how much is drafted, never what is emitted."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FixedK:
    k: int
    min_confidence: float = 0.0  # never stop drafting early

    def update(self, n_drafted: int, n_accepted: int) -> None:
        pass


@dataclass
class AdaptiveK:
    """Lengthen after a fully accepted draft, shorten after an early rejection, and let the
    draft stop on its own once its confidence in a token falls below `min_confidence`."""

    k: int = 8
    k_min: int = 1
    k_max: int = 16
    min_confidence: float = 0.5  # tuned on GSM8K with the default pair (see README)

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted == 0:
            return
        if n_accepted == n_drafted:
            self.k = min(self.k + 2, self.k_max)
        elif n_accepted < n_drafted // 2:
            self.k = max(self.k - 1, self.k_min)


DraftLengthPolicy = FixedK | AdaptiveK
