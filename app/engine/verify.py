"""Stateless verification of a draft against the target's probabilities.

Returns (n_accepted, next_token): the first n_accepted draft tokens are kept, then
next_token follows; it is the target's correction when n_accepted < len(draft), else a bonus.
"""
from __future__ import annotations

import torch

from .sampling import SamplingParams, argmax, draw


def _leading_matches(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> int:
    """draft_tokens [k], target_tokens [k+1] -> how many leading drafts equal the target's."""
    k = draft_tokens.shape[0]
    matches = (draft_tokens == target_tokens[:k]).int()
    return int(matches.cumprod(0).sum())


def verify_greedy(draft_tokens: torch.Tensor, target_probs: torch.Tensor) -> tuple[int, int]:
    """draft_tokens [k] long, target_probs [k+1, V]: accept while the draft is the target's argmax."""
    target_tokens = argmax(target_probs)
    n_accepted = _leading_matches(draft_tokens, target_tokens)
    return n_accepted, int(target_tokens[n_accepted])


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Rejection sampling; the emitted tokens are distributed exactly as the target's samples.

    draft_tokens [k] long; draft_probs [k, V] (the distributions the drafts were sampled
    from) or None for a proposer without a model; target_probs [k+1, V].
    """
    k = draft_tokens.shape[0]
    if draft_probs is None:
        # A deterministic draft: sample the target at every position, keep drafts while equal.
        target_tokens = draw(target_probs, generator)
        n_accepted = _leading_matches(draft_tokens, target_tokens)
        return n_accepted, int(target_tokens[n_accepted])

    positions = torch.arange(k, device=draft_tokens.device)
    p_target = target_probs[positions, draft_tokens]
    p_draft = draft_probs[positions, draft_tokens]
    uniform = torch.rand(k, generator=generator, device=target_probs.device)
    # accept with probability min(1, p_target / p_draft), written without a division
    accepted = (uniform * p_draft < p_target).int()
    n_accepted = int(accepted.cumprod(0).sum())
    if n_accepted == k:
        return k, int(draw(target_probs[k], generator))
    residual = (target_probs[n_accepted] - draft_probs[n_accepted]).clamp_(min=0)
    if residual.sum() <= 0:  # only reachable through rounding: p_target == p_draft
        residual = target_probs[n_accepted]
    return n_accepted, int(draw(residual / residual.sum(), generator))


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    if params.greedy:
        return verify_greedy(draft_tokens, target_probs)
    return verify_sampled(draft_tokens, draft_probs, target_probs, generator)
