"""The speculative loop: propose -> verify -> commit, one step at a time.

With `NoProposer` the same loop is plain target decoding, so both modes share every line.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from .devices import synchronize
from .models.decoder import Decoder
from .errors import PromptTooLongError
from .policy import DraftLengthPolicy, StepOutcome, TimeLedger
from .kv.kept_prefixes import keep_prefix
from .proposers import Draft, Proposer
from .sampling import SamplingParams, logits_to_probs, penalize_repeats
from .steps import EmittedToken, FinishReason, Source, Stats, Step, first_stop
from .verify import verify


PROMPT_CHUNK = 256  # prompt tokens read per target pass
# A read-ahead stops within one pass of this many tokens of being told to (0.1-0.4 s on 2 cores):
# the answer that stops it waits for that pass.
READ_AHEAD_CHUNK = 32


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int
    context_length: int
    stop_tokens: frozenset[int] = frozenset()


def speculative_generate(
    target: Decoder,
    proposer: Proposer,
    policy: DraftLengthPolicy,
    prompt_ids: list[int],
    params: SamplingParams,
    limits: Limits,
    generator: torch.Generator | None = None,
    cancel: threading.Event | None = None,
    ledger: TimeLedger | None = None,
    clock: Callable[[], float] | None = None,
) -> Iterator[Step]:
    """ledger: speculation's account against plain decoding (adaptive k); a step drafts only as
    much as it allows. clock: the seconds the steps are timed with (default: wall time, after the
    device's work)."""
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty")
    room = limits.context_length - len(prompt_ids)
    if room < 1:
        raise PromptTooLongError(
            f"The prompt is {len(prompt_ids):,} tokens but the model's context holds "
            f"{limits.context_length:,}; shorten the conversation or start a new chat."
        )
    budget = min(limits.max_new_tokens, room)
    clock = _Clock(target.device, clock)

    tokens = list(prompt_ids)
    started = clock.now()
    # The cache keeps what an earlier request left that this prompt begins with (the
    # conversation so far, a regenerated answer's prompt): only the rest is read. The last
    # prompt token is fed together with the first draft.
    cached = keep_prefix(target, tokens[:-1])
    # A long prompt is read PROMPT_CHUNK tokens at a time (a 2,800-token one takes 20 s here): Stop
    # works meanwhile, and each chunk after the first is announced by a step without tokens.
    for first in range(cached, len(tokens) - 1, PROMPT_CHUNK):
        if first > cached:
            yield Step([], [], Stats(cached_prompt_tokens=cached, prompt_read=first, seconds=clock.now() - started))
            if cancel is not None and cancel.is_set():
                yield Step([], [], Stats(cached_prompt_tokens=cached, seconds=clock.now() - started),
                           finish=FinishReason.CANCELLED)
                return
        target.feed(torch.tensor(tokens[first : min(first + PROMPT_CHUNK, len(tokens) - 1)]))
    draft_cached = proposer.begin(tokens)
    stats = Stats(prefill_seconds=clock.now() - started, cached_prompt_tokens=cached)
    # The draft model reads the rest of the prompt when it first drafts (the policy may decode
    # plainly first); that reading is prefill, as it is for llama.cpp's speculative decoding,
    # not a cost of the tokens generated.
    prompt_unread_by_draft = len(tokens) - 1 - draft_cached

    n_new = 0
    while n_new < budget:
        if cancel is not None and cancel.is_set():
            yield Step([], [], replace(stats, seconds=clock.now() - started), finish=FinishReason.CANCELLED)
            return
        # Leave room for the token the target adds, within both limits.
        room = budget - n_new - 1
        # The first token comes as soon as the target has read the prompt (as vLLM's does): the
        # draft starts at the second step, from the token the target chose.
        behind = proposer.behind()
        k = 0 if n_new == 0 else min(policy.next_k(budget - n_new, behind, n_new), room)
        keep_drafting, use_copies = policy.keep_drafting, policy.use_copies
        if ledger is not None:  # copies and drafted tokens spend from its account
            reading = max(behind - prompt_unread_by_draft, 0)
            k = ledger.allow(k, reading)
            keep_drafting, use_copies = ledger.rules(policy, reading)
        draft_start = clock.now()
        draft = proposer.propose(k, keep_drafting, limit=room, use_copies=use_copies)
        draft_tokens = draft.tokens.to(target.device)
        target_start = clock.now()
        step_input = torch.cat([torch.tensor([tokens[-1]], device=target.device), draft_tokens])
        target_logits = target.forward(step_input, keep=len(draft) + 1)  # [len(draft) + 1, V]
        target_probs = logits_to_probs(penalize_repeats(target_logits, tokens, draft.tokens.tolist(), params), params)
        target_end = clock.now()  # also the step's end for the answer's wall time: one reading (a CUDA sync)
        draft_seconds, target_seconds = target_start - draft_start, target_end - target_start
        n_accepted, next_token = verify(draft_tokens, draft.probs, target_probs, params, generator)

        target.rollback(len(tokens) + n_accepted)
        proposer.commit(n_accepted, next_token)
        emitted, finish = _until_stop(_provenance(draft, n_accepted, next_token, target_probs), limits.stop_tokens)
        emitted_ids = [token.id for token in emitted]
        # The policy prices the proposer's own tokens: those looked up beside them cost it nothing,
        # and a copy rejected before them leaves them unjudged.
        own_accepted = min(max(n_accepted - draft.lead, 0), draft.own)
        policy.observe(StepOutcome(draft.own, own_accepted, draft_seconds - draft.catch_up_seconds,
                                   target_seconds, len(draft) + 1, draft.catch_up_tokens, draft.catch_up_seconds,
                                   draft.copies, draft.copies_at, emitted_ids, len(tokens),
                                   judged=n_accepted >= draft.lead))
        tokens += emitted_ids
        n_new += len(emitted)
        if finish is None and n_new >= budget:
            finish = FinishReason.LENGTH if budget == limits.max_new_tokens else FinishReason.CONTEXT
        prompt_share = 0.0
        if draft.catch_up_tokens and prompt_unread_by_draft:
            read = min(prompt_unread_by_draft, draft.catch_up_tokens)
            prompt_share = draft.catch_up_seconds * read / draft.catch_up_tokens
            prompt_unread_by_draft -= read
        if ledger is not None:
            ledger.record(len(draft), len(emitted), draft_seconds - prompt_share + target_seconds)
        stats = stats.after_step(len(draft), n_accepted, len(emitted), draft_seconds - prompt_share, target_seconds,
                                 prefill_seconds=prompt_share, looked_up=draft.looked_up, seconds=target_end - started)
        yield Step(emitted, draft.tokens[n_accepted:].tolist(), stats, finish)
        if finish:
            return


def read_ahead_into(model: Decoder, prompt_ids: list[int], cancel: threading.Event) -> int:
    """Reads a prompt before it is sent (the message being typed) into a model's cache as its
    request would: the cache keeps what it holds of the prompt, and the rest but the last token
    (which the request's first step reads) is read READ_AHEAD_CHUNK tokens at a time until `cancel`
    is set. Returns how many prompt tokens the cache then holds; the request reads only what is
    left. On the low-bit path the cache gets the very bits the request's own reading would write
    (the layer stack is batch-invariant), so the answer is the same."""
    tokens = prompt_ids[:-1]
    cached = keep_prefix(model, tokens)
    for first in range(cached, len(tokens), READ_AHEAD_CHUNK):
        if cancel.is_set():
            break
        model.feed(torch.tensor(tokens[first : first + READ_AHEAD_CHUNK]))
    return model.length


def _until_stop(emitted: list[EmittedToken], stop_tokens: frozenset[int]) -> tuple[list[EmittedToken], FinishReason | None]:
    """Cut after the first stop token (kept, so callers see why generation ended)."""
    stop = first_stop([token.id for token in emitted], stop_tokens)
    return (emitted, None) if stop is None else (emitted[: stop + 1], FinishReason.STOP)


def _provenance(draft: Draft, n_accepted: int, next_token: int, target_probs: torch.Tensor) -> list[EmittedToken]:
    """target_probs [len(draft)+1, V] -> the step's tokens labelled by where they came from."""
    ids = draft.tokens[:n_accepted].tolist() + [next_token]
    positions = torch.arange(len(ids), device=target_probs.device)
    id_tensor = torch.tensor(ids, device=target_probs.device)
    p_target = target_probs[positions, id_tensor].tolist()
    p_draft = [None] * len(ids)
    copied = [draft.copied(i) for i in range(len(ids))]
    if draft.probs is not None:
        rows = min(len(ids), len(draft))
        drawn = draft.probs[positions[:rows], id_tensor[:rows]].tolist()
        p_draft[:rows] = [None if copied[i] else p for i, p in enumerate(drawn)]  # a copy's certainty is no model's

    out = [EmittedToken(t, Source.ACCEPTED, p, q, copied=c) for t, p, q, c in zip(ids[:-1], p_target, p_draft, copied)]
    if len(draft) == 0:
        out.append(EmittedToken(next_token, Source.PLAIN, p_target[-1]))
    elif n_accepted < len(draft):
        out.append(EmittedToken(next_token, Source.CORRECTED, p_target[-1], p_draft[-1],
                                replaced=int(draft.tokens[n_accepted]), copied=copied[-1]))
    else:
        out.append(EmittedToken(next_token, Source.BONUS, p_target[-1]))
    return out


class _Clock:
    """Wall time; on a GPU it waits for the device first, so time lands in the right phase."""

    def __init__(self, device: torch.device, read: Callable[[], float] | None = None) -> None:
        self.device, self.read = device, read or time.perf_counter

    def now(self) -> float:
        synchronize(self.device)
        return self.read()
