"""A reasoning model's thinking (Qwen3's <think> ... </think>, or a DeepSeek-R1 distillation's,
whose template opens it in the prompt), found in an answer's text."""
from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def thinking_span(text: str) -> tuple[int, int] | None:
    """Where an answer's thinking lies (its text, without the markers): from a <think> that opens
    the answer to its </think> (or the end, while it thinks), or from the start to a </think> that
    begins a line (DeepSeek-R1's template opens the thinking in the prompt; a </think> within a
    line is an answer's mention of the tag). None: no thinking."""
    opening = len(text) - len(text.lstrip())
    if text.startswith(THINK_OPEN, opening):
        start = opening + len(THINK_OPEN)
        end = text.find(THINK_CLOSE, start)
        return start, end if end >= 0 else len(text)
    end = text.find("\n" + THINK_CLOSE)
    return (0, end + 1) if end >= 0 else None


def without_thinking(text: str) -> str:
    """An answer as copied: its thinking left out (kept while the model is still thinking)."""
    span = thinking_span(text)
    if span is None or not text.startswith(THINK_CLOSE, span[1]):
        return text
    return text[span[1] + len(THINK_CLOSE):].lstrip("\n")
