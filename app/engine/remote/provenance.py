"""Where each token of a served answer came from, read off the server's own speculation.

vLLM (with `--per-request-spec-decode-metrics detailed`) and SpecChat's own server stream one
chunk per engine step and end with `per_step_accepted` and `per_step_drafted`. That is enough to
label every token as the server decided it:
- the first token, made by the step that read the prompt, is plain;
- each verifying step's block is its accepted draft tokens, then one target token;
- that target token is corrected when fewer were accepted than drafted, bonus when all were.

Live labels come from the chunks' sizes; the final arrays then decide. A chunk holding two steps
(a server that fell behind its client merges them) makes the live labels wrong: that mismatch is
logged and the exact labels replace them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..steps import Source


def step_sources(accepted: int, drafted: int) -> list[Source]:
    """The sources of one step's block (a step that drafted nothing makes one plain token)."""
    if drafted == 0:
        return [Source.PLAIN]
    return [Source.ACCEPTED] * accepted + [Source.CORRECTED if accepted < drafted else Source.BONUS]


def exact_sources(per_step_accepted: list[int], per_step_drafted: list[int], tokens: int) -> list[Source] | None:
    """The sources of an answer's `tokens` tokens from the server's per-step arrays; the last block
    may be cut short (an end token or the length limit among its tokens). None when the arrays
    do not account for every token (they belong to another answer, or the server read the prompt
    again mid-answer)."""
    if len(per_step_accepted) != len(per_step_drafted):
        return None
    sources, last_block = [Source.PLAIN], 1
    for accepted, drafted in zip(per_step_accepted, per_step_drafted):
        if not 0 <= accepted <= drafted:
            return None
        block = step_sources(accepted, drafted)
        sources, last_block = sources + block, len(block)
    if not len(sources) - last_block < tokens <= len(sources):
        return None
    return sources[:tokens]


@dataclass
class LiveLabels:
    """Labels for an answer's chunks as they come, each chunk taken as one server step.
    spec_tokens: the server's draft length k (None: it does not say how its tokens were made,
    so every token is plain)."""

    spec_tokens: int | None
    chunks: int = 0

    def label(self, tokens: int) -> list[Source]:
        """The sources of a chunk of `tokens` tokens."""
        if tokens == 0:
            return []
        first, self.chunks = self.chunks == 0, self.chunks + 1
        if self.spec_tokens is None:
            return [Source.PLAIN] * tokens
        if first:  # the prompt's step (a merged chunk may hold the next step's block too)
            return [Source.PLAIN] + (self._block(tokens - 1) if tokens > 1 else [])
        return self._block(tokens)

    def _block(self, tokens: int) -> list[Source]:
        accepted = min(tokens - 1, self.spec_tokens)
        return step_sources(accepted, self.spec_tokens) + [Source.PLAIN] * (tokens - 1 - accepted)
