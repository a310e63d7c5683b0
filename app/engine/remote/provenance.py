"""Where each token of a served answer came from, read off the server's own speculation.

vLLM (with `--per-request-spec-decode-metrics detailed`) and SpecChat's own server stream one
chunk per engine step and end with `per_step_accepted` and `per_step_drafted`. That is enough to
label every token as the server decided it:
- the first token, made by the step that read the prompt, is plain;
- each verifying step's block is its accepted draft tokens, then one target token;
- that target token is corrected when fewer were accepted than drafted, bonus when all were.

Live labels come from the chunks' sizes; the final arrays then decide. A chunk holding two steps
(a server that fell behind its client merges them) makes the live labels wrong: that mismatch is
logged and the exact labels replace them. A server that lists only the steps that drafted (vLLM's
meaning of its arrays) leaves plain tokens between them, found by aligning the arrays with the
chunks; where several alignments fit, or no account came (Stop, a failure), the colours are marked
estimated.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..steps import Source


def step_sources(accepted: int, drafted: int) -> list[Source]:
    """The sources of one step's block (a step that drafted nothing makes one plain token)."""
    if drafted == 0:
        return [Source.PLAIN]
    return [Source.ACCEPTED] * accepted + [Source.CORRECTED if accepted < drafted else Source.BONUS]


MAX_READINGS = 100_000  # states of the alignment below; past it the answer's colours stay estimated


@dataclass(frozen=True)
class Reading:
    """The sources of an answer's tokens as the server's account gives them; unique: no other
    reading of the account fits the chunks (else these are one of several, an estimate)."""

    sources: list[Source]
    unique: bool


def exact_sources(per_step_accepted: list[int], per_step_drafted: list[int], chunks: list[int]) -> Reading | None:
    """The sources of an answer streamed as `chunks` (each chunk's token count) from the server's
    per-step arrays. The first token, made by the step that read the prompt, is plain (vLLM's; a
    SpecChat server names each token's source itself). Each later step is a block of the arrays,
    in order, or, for a server that lists
    only the steps that drafted (vLLM's meaning), a plain token between them; a chunk holds whole
    steps (one, or several when the server fell behind); the last block may be cut short (an end
    token or the length limit among its tokens). None when no reading accounts for every token
    (the arrays belong to another answer, or the server read the prompt again mid-answer)."""
    if len(per_step_accepted) != len(per_step_drafted) or not all(
            0 <= accepted <= drafted for accepted, drafted in zip(per_step_accepted, per_step_drafted)):
        return None
    total, steps = sum(chunks), len(per_step_accepted)
    ends, at = set(), 0
    for size in chunks:
        at += size
        ends.add(at)
    # a server that lists its plain steps too (drafted 0) lists them all, but the prompt's
    lists_plain = 0 in per_step_drafted
    # readings[position][steps of the arrays used] = (readings that far, capped at 2; where from; the block)
    readings: list[dict[int, tuple[int, tuple[int, int] | None, list[Source]]]] = [{} for _ in range(total + 1)]
    readings[0][0] = (1, None, [])
    states = 0
    # the tokens the blocks from each one on make: a state that leaves them too few is no reading
    rest = [0] * (steps + 1)
    for used in range(steps - 1, -1, -1):
        rest[used] = rest[used + 1] + per_step_accepted[used] + 1

    def reach(position: int, used: int, count: int, came_from: tuple[int, int], block: list[Source]) -> None:
        if total - position < rest[used] - (per_step_accepted[-1] if used < steps else 0):
            return
        before = readings[position].get(used)
        readings[position][used] = (min(2, count + (before[0] if before else 0)), *(before[1:] if before else
                                                                                    (came_from, block)))

    def fits(start: int, end: int) -> bool:  # no chunk ends inside the step
        return not any(inside in ends for inside in range(start + 1, end))

    for position in range(total):
        for used, (count, _, _) in sorted(readings[position].items()):
            states += 1
            if states > MAX_READINGS:
                return None
            if position == 0 or not lists_plain:
                reach(position + 1, used, count, (position, used), [Source.PLAIN])
            if used < steps and position > 0:
                block = step_sources(per_step_accepted[used], per_step_drafted[used])
                if position + len(block) <= total and fits(position, position + len(block)):
                    reach(position + len(block), used + 1, count, (position, used), block)
    # The last block whole, else cut as little as will do (a cut trades tokens for plain ones).
    final, tail = readings[total].get(steps), []
    state = (total, steps)
    if final is None and steps:
        last = step_sources(per_step_accepted[-1], per_step_drafted[-1])
        for kept in range(len(last) - 1, 0, -1):
            start = total - kept
            if start > 0 and steps - 1 in readings[start] and fits(start, total):
                final, tail, state = readings[start][steps - 1], last[:kept], (start, steps - 1)
                break
    if final is None:
        return None
    sources = list(tail)
    while readings[state[0]][state[1]][1] is not None:
        _, came_from, block = readings[state[0]][state[1]]
        sources[:0] = block
        state = came_from
    return Reading(sources, final[0] == 1)


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
