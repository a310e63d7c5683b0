"""Conversations as plain data: messages with per-token provenance and stats."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass
class TokenRecord:
    """One answer token as shown: its text piece and where it came from."""

    text: str
    source: str  # accepted | corrected | bonus | plain
    p_target: float
    p_draft: float | None = None
    replaced: str | None = None  # text of the draft token a corrected token replaced
    rejected: str = ""  # text of the draft tokens rejected at this position (ghost text)


@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str
    tokens: list[TokenRecord] = field(default_factory=list)
    stats: dict = field(default_factory=dict)  # acceptance, speed, mode... for assistant messages
    created: float = field(default_factory=time.time)
    id: int | None = None  # set by the store

    def to_prompt(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}

    def tokens_as_dicts(self) -> list[dict]:
        return [asdict(token) for token in self.tokens]


@dataclass
class Conversation:
    title: str = "New chat"
    messages: list[Message] = field(default_factory=list)
    id: int | None = None
    updated: float = field(default_factory=time.time)

    def prompt_messages(self) -> list[dict[str, str]]:
        return [m.to_prompt() for m in self.messages]
