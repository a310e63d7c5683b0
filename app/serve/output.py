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
    """spec_tokens: the most draft tokens a step may verify as configured (vLLM's num_spec_tokens)."""

    def __init__(self, tokenizer, stop: list[str], spec_tokens: int = 0) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # characters a stop string may still need
        self.pending: list[dict] = []  # tokens whose text is not released yet: {"id", "text", "source"[, "copied"]}
        self.text = ""  # released so far
        self.stats = Stats()
        self.finish: str | None = None  # "stop" | "length" (None: still running)
        self.spec_tokens = spec_tokens
        self.sent_tokens = 0  # the tokens released: what usage counts

    def add(self, step: Step) -> Released:
        """The step's tokens; what may be sent now."""
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
        self.sent_tokens += len(released.provenance)
        return released

    @property
    def done(self) -> bool:
        return self.finish is not None

    def usage(self, prompt_tokens: int) -> dict:
        """The tokens sent (none after a stop string), as the answer's token_ids and provenance list them."""
        sent = self.sent_tokens
        return {"prompt_tokens": prompt_tokens, "completion_tokens": sent, "total_tokens": prompt_tokens + sent}

    def metrics(self) -> dict:
        """vLLM's per-request speculative-decoding metrics, with its meanings (docs/serving.md):
        num_spec_tokens the configured draft length; num_spec_steps the steps that verified a
        draft (the first step's copies included, steps that drafted nothing not); the per-step
        arrays one entry per such step; acceptance_histogram[n] the steps that accepted n."""
        accepted, drafted = list(self.stats.accepted_lengths), list(self.stats.drafted_lengths)
        histogram = [0] * (max([self.spec_tokens, *drafted]) + 1)
        for count in accepted:
            histogram[count] += 1
        steps = len(drafted)
        return {"speculative_decoding": {
            "num_spec_steps": steps, "num_draft_tokens": sum(drafted), "num_accepted_draft_tokens": sum(accepted),
            "num_spec_tokens": self.spec_tokens,
            "mean_acceptance_length": round(1 + sum(accepted) / steps, 4) if steps else 1.0,
            "draft_acceptance_rate": round(sum(accepted) / sum(drafted), 4) if sum(drafted) else 0.0,
            "acceptance_histogram": histogram, "per_step_accepted": accepted, "per_step_drafted": drafted}}


def _find(text: str, stop: str) -> int | None:
    index = text.find(stop)
    return None if index < 0 else index
