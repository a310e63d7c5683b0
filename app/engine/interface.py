"""The engine as the chat, the window and the server use it, declared: SpeculativeEngine (models
here) and RemoteEngine (a target on a server) both implement it, and tests/test_server.py checks
that they do, member by member. Without torch: the window and the server import it first."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from .choices import GenerationOptions
from .steps import Step


@runtime_checkable
class Target(Protocol):
    """What callers read of the target model, wherever it runs."""

    name: str
    tokenizer: object
    context_length: int  # 0: unknown (a server that does not say)
    label: str  # its precision and what runs it, or where it is served
    memory_bytes: int  # in this process (0 for a served one)


@runtime_checkable
class Engine(Protocol):
    target: Target
    draft: object | None  # the draft model here (None: prompt lookup, or the server's own draft)
    draft_refused: str | None  # why the chosen draft cannot draft for this target
    served_by: str | None  # the server's address when the target runs there
    rounding_note: str | None  # why greedy output may part between speculative and plain here
    kv_cache: object | None  # the caches' dtype (None: none here)

    @property
    def vocabulary_size(self) -> int:
        """Token ids a prompt may hold: 0 to vocabulary_size - 1."""

    def spec_tokens(self, options: GenerationOptions) -> int:
        """The most draft tokens one step may verify under `options` (vLLM's num_spec_tokens)."""

    def generate(self, prompt_ids: list[int], options: GenerationOptions,
                 cancel: threading.Event | None = None) -> Iterator[Step]:
        """One answer's steps; one answer at a time."""

    def read_ahead(self, prompt_ids: list[int], cancel: threading.Event) -> int: ...

    def save_caches(self, wait_seconds: float = 5.0) -> bool: ...

    def forget_conversation(self, token_ids: list[int], wait_seconds: float = 5.0) -> bool: ...

    def cache_bytes(self) -> int: ...
