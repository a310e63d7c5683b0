"""Engine steps -> an assistant message: text pieces per token, provenance, stats."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..engine.api import FinishReason, Source, Stats, Step
from .conversation import AnswerStats, Message, TokenRecord
from .detokenize import IncrementalDecoder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class AnswerBuilder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, mode: str, prompt_tokens: int = 0,
                 context_length: int = 0, made_with: str = "", continues: Message | None = None) -> None:
        """continues: an answer this request goes on with (Continue): its tokens, text and stats
        stay at the start of the new one, whose totals include them."""
        self.tokenizer = tokenizer
        self.decoder = IncrementalDecoder(tokenizer)
        self.tokens: list[TokenRecord] = []
        # What the answer had before this request: nothing, or the totals of the one continued.
        self.base = Stats()
        self._answer = dict(mode=mode, prompt_tokens=prompt_tokens, context_length=context_length, made_with=made_with)
        if continues is not None:
            for token_id in continues.stats.token_ids:
                self.decoder.push(token_id)
            self.tokens = list(continues.tokens)
            self.base = base = continues.stats  # its Stats part adds up (Stats.__add__ reads only that)
            # a continued answer keeps the prompt it started from
            self._answer.update(mode=mode if mode == base.mode else f"{base.mode}, then {mode}",
                                prompt_tokens=base.prompt_tokens)
        self.stats = AnswerStats.of(self.base, **self._answer)
        self._base_records = len(self.tokens)
        self._pending: list[TokenRecord] = []  # tokens with no text yet, waiting for the next piece
        self._spans: list[int] = []  # how many of this request's tokens each of its records holds

    @property
    def has_new_tokens(self) -> bool:
        """This request added text (a token without text of its own waits for the next)."""
        return len(self.tokens) > self._base_records

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
            if token.source is Source.CORRECTED and token.replaced is not None:  # (a server does not say)
                record.replaced = self._text([token.replaced])
                record.rejected = self._text(step.rejected)
            if not piece:
                self._pending.append(record)
                continue
            new.append(_merged(self._pending + [record]))
            self._spans.append(len(self._pending) + 1)
            self._pending = []
        self.tokens += new
        if step.relabelled is not None:
            self._relabel(step.relabelled)
        self._record(step.stats, step.finish)
        return new

    def _relabel(self, sources: tuple[Source, ...]) -> None:
        """Gives this request's records the sources of their tokens (as _merged chooses them)."""
        first = 0
        for index, span in enumerate(self._spans, start=self._base_records):
            telling = max(sources[first:first + span], key=_TELLING.get, default=self.tokens[index].source)
            self.tokens[index] = replace(self.tokens[index], source=telling)
            first += span

    def _record(self, stats: Stats, finish: FinishReason | None) -> None:
        self.stats = AnswerStats.of(self.base + stats, **self._answer, finish=finish or self.stats.finish)

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
