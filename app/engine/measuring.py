"""Timing generations, whichever engine makes them (ours, transformers', llama.cpp's): the runs
and totals that `bench speed` and the draft finder share."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .engine import GenerationOptions, SpeculativeEngine
from .steps import Stats

Run = Callable[[list[int], int], "RunResult"]  # (prompt, max new tokens)


@dataclass
class RunResult:
    ids: list[int]
    stats: Stats | None = None
    prefill_seconds: float | None = None  # when the mode can tell prefill from decoding
    first_token_seconds: float | None = None  # from the call to the first token, where the mode can tell
    seconds: float | None = None  # the timed part, where the mode does untimed work first (a read-ahead)


@dataclass
class ModeTotals:
    tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float | None = 0.0  # None once a run could not tell
    prompt_tokens: int = 0
    stats: list[Stats] = field(default_factory=list)
    first_token_seconds: list[float] = field(default_factory=list)

    def add(self, result: RunResult, seconds: float, prompt_tokens: int) -> None:
        self.tokens += len(result.ids)
        self.seconds += seconds
        self.prompt_tokens += prompt_tokens
        if result.first_token_seconds is not None:
            self.first_token_seconds.append(result.first_token_seconds)
        prefill = result.stats.prefill_seconds if result.stats else result.prefill_seconds
        self.prefill_seconds = None if prefill is None or self.prefill_seconds is None else self.prefill_seconds + prefill
        if result.stats:
            self.stats.append(result.stats)

    def summary(self) -> dict:
        out = {"tokens": self.tokens, "seconds": round(self.seconds, 3), "tokens_per_s": round(self.tokens_per_s, 3)}
        if self.prefill_seconds:
            out["prefill_tokens_per_s"] = round(self.prompt_tokens / self.prefill_seconds, 2)
            out["decode_tokens_per_s"] = round(self.tokens / (self.seconds - self.prefill_seconds), 3)
        if self.first_token_seconds:
            out["first_token_seconds"] = round(sum(self.first_token_seconds) / len(self.first_token_seconds), 3)
        total = sum(self.stats, Stats())
        if total.drafted:
            out["acceptance_rate"] = round(total.acceptance_rate, 4)
            out["mean_accepted_length"] = round(total.mean_accepted_length, 3)
            out["looked_up"] = total.looked_up  # of the drafted tokens
            out["draft_seconds"] = round(total.draft_seconds, 3)
            out["target_seconds"] = round(total.target_seconds, 3)
        return out

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def engine_run(engine: SpeculativeEngine, options: GenerationOptions, read_ahead: bool = False) -> Run:
    """One of our engine's runs, timed: its whole prompt read each time, as the peers' runs read
    theirs. read_ahead: the prompt is read before the clock starts, as the window reads a message while
    it is typed."""
    def run(prompt: list[int], max_new_tokens: int) -> RunResult:
        engine.forget()  # every run reads its whole prompt, as the peers' runs do
        if read_ahead:
            engine.read_ahead(prompt, threading.Event())
        start, steps, first = time.perf_counter(), [], None
        for step in engine.generate(prompt, replace(options, max_new_tokens=max_new_tokens)):
            if step.tokens:  # not a long prompt's reading progress
                first = time.perf_counter() - start if first is None else first
            steps.append(step)
        return RunResult([t.id for s in steps for t in s.tokens], steps[-1].stats, first_token_seconds=first,
                         seconds=time.perf_counter() - start)

    return run
