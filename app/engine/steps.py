"""What the loop yields: the tokens of one step with their provenance, and running stats."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Source(str, Enum):
    ACCEPTED = "accepted"  # a draft token the target kept
    CORRECTED = "corrected"  # the target's token in place of the first rejected draft token
    BONUS = "bonus"  # the target's extra token after every draft token was accepted
    PLAIN = "plain"  # a target token with nothing drafted (speculation off, or no draft)


@dataclass(frozen=True)
class EmittedToken:
    id: int
    source: Source
    p_target: float  # target probability of this token
    p_draft: float | None = None  # draft probability of this token (None: no draft model)
    replaced: int | None = None  # for a corrected token: the draft token it replaced


@dataclass
class Stats:
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    target_passes: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    prefill_seconds: float = 0.0
    accepted_lengths: list[int] = field(default_factory=list)  # accepted drafts per step

    def record_step(self, n_drafted: int, n_accepted: int, n_emitted: int) -> None:
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.emitted += n_emitted
        self.target_passes += 1
        if n_drafted:
            self.accepted_lengths.append(n_accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target pass."""
        return self.emitted / self.target_passes if self.target_passes else 0.0

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.draft_seconds + self.target_seconds


@dataclass
class Step:
    tokens: list[EmittedToken]
    rejected: list[int]  # draft tokens discarded in this step, in order
    stats: Stats  # running totals, shared and updated in place
    finish: str | None = None  # "stop", "length", "context" or "cancelled" on the last step
