"""Engine steps -> an assistant message: text pieces per token, provenance, stats."""
from __future__ import annotations

import time

from transformers import PreTrainedTokenizerBase

from ..engine.steps import Source, Stats, Step
from .conversation import Message, TokenRecord
from .detokenize import IncrementalDecoder


class AnswerBuilder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, mode: str) -> None:
        self.tokenizer = tokenizer
        self.mode = mode  # e.g. "speculative (draft model, k=4)" or "plain"
        self.decoder = IncrementalDecoder(tokenizer)
        self.tokens: list[TokenRecord] = []
        self.acceptance_trace: list[float] = []  # running acceptance rate after each step
        self.stats = Stats()
        self.finish: str | None = None
        self.started = time.perf_counter()
        self.seconds = 0.0

    def add(self, step: Step) -> list[TokenRecord]:
        """Adds one step; returns the records it created (tokens with no visible text are folded
        into the next one, like the special stop token or half a multi-byte character)."""
        new = []
        for token in step.tokens:
            piece = self.decoder.push(token.id)
            if not piece:
                continue
            record = TokenRecord(piece, token.source.value, round(token.p_target, 4),
                                 None if token.p_draft is None else round(token.p_draft, 4))
            if token.source is Source.CORRECTED:
                record.replaced = self._text([token.replaced])
                record.rejected = self._text(step.rejected)
            new.append(record)
        self.tokens += new
        self.stats = step.stats
        self.finish = step.finish or self.finish
        self.seconds = time.perf_counter() - self.started
        if step.stats.drafted:
            self.acceptance_trace.append(round(step.stats.acceptance_rate, 4))
        return new

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def tokens_per_s(self) -> float:
        return self.stats.emitted / self.seconds if self.seconds else 0.0

    def summary(self) -> dict:
        stats = self.stats
        return {
            "mode": self.mode,
            "tokens": stats.emitted,
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "mean_accepted_length": round(stats.mean_accepted_length, 3),
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "target_passes": stats.target_passes,
            "draft_seconds": round(stats.draft_seconds, 3),
            "target_seconds": round(stats.target_seconds, 3),
            "accepted_lengths": list(stats.accepted_lengths),
            "acceptance_trace": list(self.acceptance_trace),
            "finish": self.finish,
            "token_ids": list(self.decoder.ids),
        }

    def message(self) -> Message:
        return Message(role="assistant", content=self.decoder.text, tokens=list(self.tokens), stats=self.summary())
