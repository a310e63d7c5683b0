"""The draft finder: which draft pays for a target on this machine, measured, not guessed.

Every candidate (a draft model, or prompt lookup with none) runs the same prompts as plain decoding
of the same target, interleaved prompt by prompt so that the machine's noise falls on all alike,
with `bench speed`'s timing (measuring.py). The table is ranked by the measured speed-up over
plain decoding; each result is kept per target, draft and hardware, so the draft picker can show
it later."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from .calibration import calibrate_remembered, hardware, read_json, write_json
from .choices import LOOKUP, GenerationOptions, ProposerKind
from .engine import SpeculativeEngine
from .errors import ModelError
from .files import cache_root
from .measuring import ModeTotals, engine_run
from .models.loading import LoadedModel

# Asked when the user's chats hold too few questions: code, explanation, a summary, a translation
MIXED_QUESTIONS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test.",
    "Explain in a few sentences why the sky is blue.",
    "Summarise in two sentences: The city council voted on Tuesday to extend the tram line to the new "
    "hospital. The extension, 4.2 km long with six stops, will cost 180 million and open in 2029. "
    "Opponents argued that buses would serve the hospital at a fraction of the cost.",
    "Translate into French: The meeting is moved to Thursday morning because the room is booked on Wednesday.",
)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Ranked:
    draft: str  # as the user names it: "default-draft", a path, a hub id, or LOOKUP
    speedup: float | None = None  # end to end over plain decoding; None: not measured
    decode_speedup: float | None = None
    acceptance: float | None = None
    tokens_per_pass: float | None = None  # tokens emitted per target pass
    memory_bytes: int = 0  # the draft's weights
    identical: bool | None = None  # every answer the same as plain decoding's (greedy)
    note: str = ""  # why it was not measured


def rank_drafts(target: LoadedModel, drafts: list[str], prompts: list[list[int]], options: GenerationOptions,
                load: Callable[[str], LoadedModel], max_new_tokens: int = 64, budget_seconds: float | None = None,
                progress: Progress | None = None) -> list[Ranked]:
    """Measures every draft (or LOOKUP) for `target` on `prompts` and ranks them by speed-up over
    plain decoding. load: a draft's name -> the loaded model (ModelError: why it cannot be). A
    candidate that cannot load or does not fit the target is listed with the reason. Once
    budget_seconds have passed no further prompt starts (every candidate runs the same prompts)."""
    say = progress or (lambda text: None)
    start = time.monotonic()
    plain = engine_run(SpeculativeEngine(target, None), replace(options, speculative=False))
    runs, refused = {}, []
    for name in drafts:
        if name == LOOKUP:
            runs[name] = (engine_run(SpeculativeEngine(target, None), replace(options, speculative=True,
                                                                            proposer=ProposerKind.PROMPT_LOOKUP)), 0)
            continue
        say(f"loading {name}")
        try:
            draft = load(name)
        except ModelError as error:
            refused.append(Ranked(name, note=str(error)))
            continue
        engine = SpeculativeEngine.for_pair(target, draft)
        if engine.draft_refused:  # another vocabulary: said, not hidden
            refused.append(Ranked(name, memory_bytes=draft.memory_bytes, note=engine.draft_refused))
            continue
        calibrate_remembered(engine)  # the costs the adaptive policy starts from, timed once per pair
        runs[name] = (engine_run(engine, replace(options, speculative=True)), draft.memory_bytes)
    for run in [plain, *(run for run, _ in runs.values())]:  # warm-up: first calls allocate (and time the costs)
        run(prompts[0], 4)
    totals = {name: ModeTotals() for name in ("plain", *runs)}
    identical = dict.fromkeys(runs, True)
    for index, prompt in enumerate(prompts):
        if budget_seconds is not None and index and time.monotonic() - start > budget_seconds:
            say(f"budget spent after {index} of {len(prompts)} prompts")
            break
        say(f"prompt {index + 1} of {len(prompts)}: plain")
        reference = _timed(plain, prompt, max_new_tokens, totals["plain"])
        for name, (run, _) in runs.items():
            say(f"prompt {index + 1} of {len(prompts)}: {name}")
            identical[name] &= _timed(run, prompt, max_new_tokens, totals[name]) == reference
    base = totals["plain"].summary()
    measured = []
    for name, (_, memory) in runs.items():
        summary = totals[name].summary()
        measured.append(Ranked(
            name, _ratio(summary.get("tokens_per_s"), base.get("tokens_per_s")),
            _ratio(summary.get("decode_tokens_per_s"), base.get("decode_tokens_per_s")),
            summary.get("acceptance_rate"), summary.get("mean_accepted_length"), memory,
            identical[name] if options.sampling.temperature == 0 else None))
    measured.sort(key=lambda row: -(row.speedup or 0))
    return measured + refused


def questions(recent: list[str], count: int) -> list[str]:
    """The prompts' questions: the user's latest (ChatStore.recent_questions) when the chats hold
    enough, else the built-in mixed set. Read from the chats file only; nothing leaves the machine."""
    return recent[:count] if len(recent) >= count else list(MIXED_QUESTIONS[:count])


def _timed(run, prompt: list[int], max_new_tokens: int, total: ModeTotals) -> list[int]:
    begun = time.perf_counter()
    result = run(prompt, max_new_tokens)
    total.add(result, time.perf_counter() - begun, len(prompt))
    return result.ids


def _ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 3) if value and base else None


def results_path() -> Path:
    return cache_root() / "draft_ranks.json"


def remember(target: LoadedModel, ranked: list[Ranked], path: Path | None = None) -> None:
    """Keeps each measured result per target, draft and hardware."""
    path = path or results_path()
    kept = read_json(path)
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for row in ranked:
        if row.speedup is not None:
            kept[_key(target, row.draft)] = {**asdict(row), "measured": when}
    write_json(path, kept)


def last_measured(target: LoadedModel, draft: str, path: Path | None = None) -> dict | None:
    """The last result kept for this target, draft and hardware: its Ranked fields and when."""
    return read_json(path or results_path()).get(_key(target, draft))


def _key(target: LoadedModel, draft: str) -> str:
    return f"{target.name} ({target.label}) | {draft} | {hardware(target.model.device)}"
