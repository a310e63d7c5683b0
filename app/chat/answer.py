"""Engine steps -> an assistant message: text pieces per token, provenance, stats."""
from __future__ import annotations

import time
from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from ..engine.steps import FinishReason, Source, Stats, Step
from .conversation import AnswerStats, Message, TokenRecord
from .detokenize import IncrementalDecoder


class AnswerBuilder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, mode: str, prompt_tokens: int = 0,
                 context_length: int = 0, made_with: str = "") -> None:
        self.tokenizer = tokenizer
        self.decoder = IncrementalDecoder(tokenizer)
        self.tokens: list[TokenRecord] = []
        self.stats = AnswerStats(mode=mode, prompt_tokens=prompt_tokens, context_length=context_length,
                                 made_with=made_with)
        self.started = time.perf_counter()
        self._pending: list[TokenRecord] = []  # tokens with no text yet, waiting for the next piece

    def add(self, step: Step) -> list[TokenRecord]:
        """Adds one step; returns the records it created. A token with no visible text of its own
        (half of a multi-byte character, a special token) is merged into the next token's
        record, which keeps the most telling provenance of the two (corrected over bonus over
        accepted), so a correction is never lost."""
        new = []
        for token in step.tokens:
            piece = self.decoder.push(token.id)
            record = TokenRecord(piece, token.source, round(token.p_target, 4),
                                 None if token.p_draft is None else round(token.p_draft, 4), copied=token.copied)
            if token.source is Source.CORRECTED:
                record.replaced = self._text([token.replaced])
                record.rejected = self._text(step.rejected)
            if not piece:
                self._pending.append(record)
                continue
            new.append(_merged(self._pending + [record]))
            self._pending = []
        self.tokens += new
        self._record(step.stats, step.finish)
        return new

    def _record(self, stats: Stats, finish: FinishReason | None) -> None:
        seconds = time.perf_counter() - self.started
        old = self.stats
        self.stats = replace(
            old, tokens=stats.emitted, seconds=round(seconds, 3),
            first_token_seconds=old.first_token_seconds if old.first_token_seconds is not None or not stats.emitted
            else round(seconds, 3),
            drafted=stats.drafted, accepted=stats.accepted, looked_up=stats.looked_up, target_passes=stats.target_passes,
            cached_prompt_tokens=stats.cached_prompt_tokens,
            draft_seconds=round(stats.draft_seconds, 3), target_seconds=round(stats.target_seconds, 3),
            accepted_lengths=stats.accepted_lengths,
            acceptance_trace=old.acceptance_trace + ((round(stats.acceptance_rate, 4),) if stats.drafted else ()),
            finish=finish or old.finish)

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def message(self, finish: FinishReason | None = None) -> Message:
        """The answer so far as a message (`finish` overrides, e.g. INTERRUPTED on close)."""
        stats = replace(self.stats, finish=finish or self.stats.finish, token_ids=tuple(self.decoder.ids))
        return Message(role="assistant", content=self.decoder.text, tokens=list(self.tokens), stats=stats)


_TELLING = {Source.CORRECTED: 3, Source.BONUS: 2, Source.PLAIN: 1, Source.ACCEPTED: 0}


def _merged(records: list[TokenRecord]) -> TokenRecord:
    """Tokens that only together make visible text (the bytes of one character) as one record."""
    if len(records) == 1:
        return records[0]
    chosen = max(records, key=lambda r: _TELLING[r.source])
    return replace(chosen, text="".join(r.text for r in records),
                   rejected="".join(r.rejected for r in records))
