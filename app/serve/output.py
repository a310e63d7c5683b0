"""One request's output as the API sends it: the engine's steps -> text with stop strings cut,
per-token provenance, usage, finish reason, and vLLM's per-request speculative-decoding metrics.

Provenance, our extension, is a list per chunk of {"id", "text", "source"} (source: accepted,
corrected, bonus or plain; "copied": true for a draft token copied from earlier text). Text that
could still begin a stop string is held back until the next step shows it does not; without stop
strings each chunk holds one step's tokens, as vLLM's do."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..chat.detokenize import IncrementalDecoder
from ..engine.api import FinishReason, Stats, Step


@dataclass
class Released:
    """What one step lets out: the text and the tokens it comes from."""

    text: str = ""
    provenance: list[dict] = field(default_factory=list)


class RequestOutput:
    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # characters a stop string may still need
        self.pending: list[dict] = []  # tokens whose text is not released yet: {"id", "text", "source"[, "copied"]}
        self.text = ""  # released so far
        self.stats = Stats()
        self.finish: str | None = None  # "stop" | "length" (None: still running)
        # (accepted, drafted) of each step after the first, steps that drafted nothing included:
        # with the first token plain, they account for every token (vLLM's per-step metrics)
        self.per_step: list[tuple[int, int]] = []
        self._steps = 0

    def add(self, step: Step) -> Released:
        """The step's tokens; what may be sent now."""
        if step.tokens:
            if self._steps:
                self.per_step.append((step.stats.accepted - self.stats.accepted, step.stats.drafted - self.stats.drafted))
            self._steps += 1
        self.stats = step.stats
        for token in step.tokens:
            entry = {"id": token.id, "text": self.decoder.push(token.id), "source": token.source.value}
            if token.copied:
                entry["copied"] = True
            self.pending.append(entry)
        if step.finish is not None:
            self.finish = "length" if step.finish in (FinishReason.LENGTH, FinishReason.CONTEXT) else "stop"
        return self._release(final=step.finish is not None)

    def _release(self, final: bool) -> Released:
        # Released text never ends in the start of a stop string (`hold` characters stay back), so
        # a stop string lies wholly in the text waiting.
        waiting = "".join(entry["text"] for entry in self.pending)
        cut = min((i for i in (_find(waiting, s) for s in self.stop) if i is not None), default=None)
        if cut is not None:  # a stop string: the answer ends before it
            self.finish = "stop"
            keep, final = cut, True
        else:
            keep = len(waiting) if final else max(len(waiting) - self.hold, 0)
        released, taken = Released(), 0
        # the end token too, whose text is empty; without stop strings, a token that ends a step
        # with half a character (its text comes with the next token's)
        everything = (final and cut is None) or not self.stop
        while self.pending and (taken < keep or everything):
            entry = self.pending[0]
            if taken + len(entry["text"]) > keep:
                if not final:
                    break  # the whole token goes out with the next step
                entry = {**entry, "text": entry["text"][: keep - taken]}
            released.provenance.append(entry)
            released.text += entry["text"]
            taken += len(entry["text"])
            self.pending.pop(0)
        if final:
            self.pending.clear()
        self.text += released.text
        return released

    @property
    def done(self) -> bool:
        return self.finish is not None

    def usage(self, prompt_tokens: int) -> dict:
        generated = self.stats.emitted
        return {"prompt_tokens": prompt_tokens, "completion_tokens": generated, "total_tokens": prompt_tokens + generated}

    def metrics(self) -> dict:
        """vLLM's per-request speculative-decoding metrics, under its names."""
        accepted = [a for a, _ in self.per_step]
        drafted = [d for _, d in self.per_step]
        spec_tokens = max(drafted, default=0)
        histogram = [0] * (spec_tokens + 1)
        for count in accepted:
            histogram[count] += 1
        steps = len(self.per_step)
        return {"speculative_decoding": {
            "num_spec_steps": steps, "num_draft_tokens": sum(drafted), "num_accepted_draft_tokens": sum(accepted),
            "num_spec_tokens": spec_tokens,
            "mean_acceptance_length": round(1 + sum(accepted) / steps, 4) if steps else 1.0,
            "draft_acceptance_rate": round(sum(accepted) / sum(drafted), 4) if sum(drafted) else 0.0,
            "acceptance_histogram": histogram, "per_step_accepted": accepted, "per_step_drafted": drafted}}


def _find(text: str, stop: str) -> int | None:
    index = text.find(stop)
    return None if index < 0 else index
