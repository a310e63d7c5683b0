"""What the loop yields: the tokens of one step with their provenance, and running stats."""
from __future__ import annotations

from dataclasses import dataclass, replace
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
    # The draft token here (accepted, or replaced by a correction) was copied from earlier text,
    # not drafted by a model; p_draft is then None.
    copied: bool = False


class FinishReason(str, Enum):
    """Why an answer ended (stored with the message, shown under it)."""

    STOP = "stop"  # the model's end token
    LENGTH = "length"  # the answer budget (max new tokens)
    CONTEXT = "context"  # the model's context window is full
    CANCELLED = "cancelled"  # the user pressed Stop
    INTERRUPTED = "interrupted"  # the app was closed or killed mid-answer (set by the chat, not the loop)
    FAILED = "failed"  # the server serving the target failed mid-answer


@dataclass(frozen=True)
class Stats:
    """What an answer has cost so far and how speculation went, made by the engine: the running
    totals after a step. Additive: `earlier + later` are the totals of an answer that a second
    request went on with (Continue), and a benchmark sums its runs. Immutable: every step carries
    its own snapshot, so a reader on another thread never sees one half-updated."""

    drafted: int = 0  # draft tokens offered, looked-up ones included
    accepted: int = 0
    emitted: int = 0
    target_passes: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    prefill_seconds: float = 0.0
    accepted_lengths: tuple[int, ...] = ()  # accepted drafts per step that drafted
    drafted_lengths: tuple[int, ...] = ()  # drafted tokens per step that drafted
    looked_up: int = 0  # drafted tokens that were looked up in earlier text, not drafted by a model
    cached_prompt_tokens: int = 0  # prompt tokens the target's cache held from an earlier request
    prompt_read: int = 0  # while a long prompt is read (no tokens yet): prompt tokens in the cache so far
    seconds: float = 0.0  # wall time from the request's start to this step
    first_token_seconds: float | None = None  # wall time to the first token (the prompt's reading included)

    def after_step(self, n_drafted: int, n_accepted: int, n_emitted: int, draft_seconds: float,
                   target_seconds: float, prefill_seconds: float = 0.0, looked_up: int = 0,
                   seconds: float = 0.0) -> Stats:
        """seconds: the wall time since the request started, at this step's end."""
        drafting = n_drafted > 0
        return replace(
            self, drafted=self.drafted + n_drafted, accepted=self.accepted + n_accepted, looked_up=self.looked_up + looked_up,
            emitted=self.emitted + n_emitted, target_passes=self.target_passes + 1,
            draft_seconds=self.draft_seconds + draft_seconds, target_seconds=self.target_seconds + target_seconds,
            prefill_seconds=self.prefill_seconds + prefill_seconds,
            accepted_lengths=self.accepted_lengths + ((n_accepted,) if drafting else ()),
            drafted_lengths=self.drafted_lengths + ((n_drafted,) if drafting else ()), seconds=seconds,
            first_token_seconds=self.first_token_seconds if self.first_token_seconds is not None or not n_emitted
            else seconds)

    def __add__(self, later: Stats) -> Stats:
        """These totals followed by `later`'s (a request that went on with this answer). The prompt
        is the one this answer started from; the first token, its own."""
        first = self.first_token_seconds
        if first is None and later.first_token_seconds is not None:
            first = self.seconds + later.first_token_seconds
        return Stats(
            drafted=self.drafted + later.drafted, accepted=self.accepted + later.accepted,
            emitted=self.emitted + later.emitted, target_passes=self.target_passes + later.target_passes,
            draft_seconds=self.draft_seconds + later.draft_seconds, target_seconds=self.target_seconds + later.target_seconds,
            prefill_seconds=self.prefill_seconds + later.prefill_seconds,
            accepted_lengths=self.accepted_lengths + later.accepted_lengths,
            drafted_lengths=self.drafted_lengths + later.drafted_lengths, looked_up=self.looked_up + later.looked_up,
            cached_prompt_tokens=self.cached_prompt_tokens if self.emitted else later.cached_prompt_tokens,
            prompt_read=later.prompt_read, seconds=self.seconds + later.seconds, first_token_seconds=first)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target pass."""
        return self.emitted / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.emitted / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second of drafting and verifying, the prompt's reading left out."""
        seconds = self.draft_seconds + self.target_seconds
        return self.emitted / seconds if seconds else 0.0

    @property
    def acceptance_trace(self) -> tuple[float, ...]:
        """The running acceptance rate after each step that drafted."""
        trace, drafted, accepted = [], 0, 0
        for n_drafted, n_accepted in zip(self.drafted_lengths, self.accepted_lengths):
            drafted, accepted = drafted + n_drafted, accepted + n_accepted
            trace.append(round(accepted / drafted, 4))
        return tuple(trace)


@dataclass(frozen=True)
class Step:
    tokens: list[EmittedToken]
    rejected: list[int]  # draft tokens discarded in this step, in order
    stats: Stats  # running totals after this step
    finish: FinishReason | None = None  # set on the last step
    # The sources of every token of this request, in place of what earlier steps said: a served
    # answer's live labels, corrected by the server's final account (None: nothing to correct).
    relabelled: tuple[Source, ...] | None = None
    # The sources are a served answer's guess: it ended before the server's account came (Stop, a
    # failure), or the account fits more than one reading of its chunks.
    estimated: bool = False


def first_stop(ids: list[int], stop_tokens: frozenset[int]) -> int | None:
    """The index of the first token that ends an answer, None when there is none."""
    return next((i for i, token in enumerate(ids) if token in stop_tokens), None)
