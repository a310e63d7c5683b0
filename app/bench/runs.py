"""What one benchmarked generation returns, whichever engine made it (ours, transformers', llama.cpp's)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..engine.steps import Stats

Run = Callable[[list[int], int], "RunResult"]  # (prompt, max new tokens)


@dataclass
class RunResult:
    ids: list[int]
    stats: Stats | None = None
    prefill_seconds: float | None = None  # when the mode can tell prefill from decoding
    first_token_seconds: float | None = None  # from the call to the first token, where the mode can tell
    seconds: float | None = None  # the timed part, where the mode does untimed work first (a read-ahead)
