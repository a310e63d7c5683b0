"""Conversations as plain data: messages with per-token provenance and stats."""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field, fields

from ..engine.api import FinishReason, Source, Stats


@dataclass
class TokenRecord:
    """One answer token as shown: its text piece and where it came from."""

    text: str
    source: Source
    p_target: float
    p_draft: float | None = None
    replaced: str | None = None  # text of the draft token a corrected token replaced
    rejected: str = ""  # text of the draft tokens rejected at this position (ghost text)
    copied: bool = False  # the draft token here was copied from earlier text, not drafted by a model

    def __post_init__(self) -> None:
        self.source = Source(self.source)  # saved chats hold the word


@dataclass(frozen=True)
class Comparison:
    """An answer rerun with speculation off (same prompt, seed and sampling). The speeds are
    of decoding, the prompt's reading left out: the rerun finds its prompt in the cache the
    answer left, while the answer itself may have read all of it or only its last message."""

    speculative_tokens_per_s: float
    plain_tokens_per_s: float
    identical: bool
    first_difference: int | None = None  # character where the two texts first differ
    rounding_note: str | None = None  # why greedy texts may differ on the device that ran them (a GPU)

    @property
    def speedup(self) -> float:
        return self.speculative_tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else 0.0

    @classmethod
    def of(cls, answer: Message, plain: Message, rounding_note: str | None = None) -> Comparison:
        identical = answer.stats.token_ids == plain.stats.token_ids
        first = None
        if not identical:
            a, b = answer.content, plain.content
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return cls(round(answer.stats.decode_tokens_per_s, 3), round(plain.stats.decode_tokens_per_s, 3), identical, first,
                   rounding_note)


@dataclass(frozen=True)
class AnswerStats(Stats):
    """An answer's Stats (the engine's totals) with what the chat knows of it: shown under the
    message and in the acceptance view, saved with the message."""

    mode: str = ""  # e.g. "speculative (draft model, adaptive k)" or "plain"
    finish: FinishReason | None = None
    token_ids: tuple[int, ...] = ()
    prompt_tokens: int = 0
    context_length: int = 0  # the model's window (0: unknown)
    comparison: Comparison | None = None  # set by Compare
    # The generation settings it was made with (session.settings_of, as JSON text: stats are
    # hashable), so that Compare repeats them for this very answer, after a version flip or a
    # reopen too; empty in chats saved without them.
    made_with: str = ""

    @classmethod
    def of(cls, totals: Stats, **answer) -> AnswerStats:
        """The engine's totals with the answer's own fields."""
        return cls(**{f.name: getattr(totals, f.name) for f in fields(Stats)}, **answer)

    @property
    def context_used(self) -> int:
        """Prompt plus answer tokens: how much of the model's window the chat now fills."""
        return self.prompt_tokens + self.emitted

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AnswerStats:
        """From a saved message; keys this version does not know are ignored."""
        data = {"emitted": data.get("tokens", 0), **data}  # an answer's token count was saved as "tokens"
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for key in ("accepted_lengths", "drafted_lengths", "token_ids"):
            values[key] = tuple(values.get(key) or ())
        finish = values.get("finish")
        values["finish"] = FinishReason(finish) if finish in FinishReason._value2member_map_ else None
        if values.get("comparison"):
            values["comparison"] = Comparison(**values["comparison"])
        return cls(**values)


@dataclass
class Version:
    """One answer to a prompt; regenerating adds another and keeps this one."""

    content: str
    tokens: list[TokenRecord]
    stats: AnswerStats | None

    def to_dict(self) -> dict:
        return {"content": self.content, "tokens": [asdict(t) for t in self.tokens],
                "stats": self.stats.to_dict() if self.stats else {}}

    @classmethod
    def from_dict(cls, data: dict) -> Version:
        return cls(data["content"], [TokenRecord(**t) for t in data["tokens"]], AnswerStats.from_dict(data["stats"]))


@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str
    tokens: list[TokenRecord] = field(default_factory=list)
    stats: AnswerStats | None = None  # assistant messages
    created: float = field(default_factory=time.time)
    id: int | None = None  # set by the store
    # Every answer made for this place in the chat, oldest first, when there is more than one;
    # content, tokens and stats are those of versions[shown].
    versions: list[Version] = field(default_factory=list)
    shown: int = 0

    @property
    def stopped_early(self) -> bool:
        """An answer that stopped before its end (a length limit, Stop, a closed app): Continue
        can go on with it."""
        return (self.role == "assistant" and self.stats is not None and bool(self.stats.token_ids)
                and self.stats.finish in (FinishReason.LENGTH, FinishReason.CANCELLED, FinishReason.INTERRUPTED,
                                          FinishReason.FAILED))

    def to_prompt(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}

    def tokens_as_dicts(self) -> list[dict]:
        return [asdict(token) for token in self.tokens]

    def add_version(self, answer: Message) -> None:
        """Keeps what is shown now and shows `answer` (a regenerated answer)."""
        if not self.versions:
            self.versions = [Version(self.content, self.tokens, self.stats)]
        self.versions.append(Version(answer.content, answer.tokens, answer.stats))
        self.show(len(self.versions) - 1)

    def replace_shown(self, answer: Message) -> None:
        """The shown answer grown by Continue (in its version too)."""
        self.content, self.tokens, self.stats = answer.content, answer.tokens, answer.stats
        if self.versions:
            self.versions[self.shown] = Version(answer.content, answer.tokens, answer.stats)

    def set_stats(self, stats: AnswerStats) -> None:
        """New stats for the shown answer (a comparison added), in its version too."""
        self.stats = stats
        if self.versions:
            self.versions[self.shown].stats = stats

    def show(self, index: int) -> None:
        version = self.versions[index]
        self.content, self.tokens, self.stats, self.shown = version.content, version.tokens, version.stats, index


@dataclass
class Conversation:
    title: str = "New chat"
    messages: list[Message] = field(default_factory=list)
    id: int | None = None
    updated: float = field(default_factory=time.time)
    system_prompt: str = ""  # sent before the messages when not empty
    parent_id: int | None = None  # the chat this one was forked from
    preset: str = ""  # the name of the preset picked for it ('': none)

    def fork(self, upto: int, shown: int | None = None) -> Conversation:
        """A new chat (not yet saved) with this one's messages up to and including messages[upto],
        named after it; shown: the version that message shows in the fork."""
        messages = [copy.deepcopy(m) for m in self.messages[:upto + 1]]
        for message in messages:
            message.id = None
        if shown is not None:
            messages[-1].show(shown)
        return Conversation(title=f"{self.title} (fork)", messages=messages, system_prompt=self.system_prompt,
                            parent_id=self.id, preset=self.preset)

    def prompt_messages(self, upto: int | None = None) -> list[dict[str, str]]:
        """The chat as the model sees it: the system prompt, then messages[:upto]."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return system + [m.to_prompt() for m in self.messages[:upto]]
