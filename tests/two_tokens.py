"""The exact distribution of a target's first two sampled tokens, and the total variation that
sampling noise alone gives against it: what the distribution test and tools/gpu_check.py compare
speculative sampling's draws with."""
from __future__ import annotations

import torch

from app.engine.sampling import SamplingParams, logits_to_probs, penalize_repeats


def exact_two_token_distribution(target, params: SamplingParams, prompt: list[int]) -> torch.Tensor:
    """P(t1, t2 | prompt) [V, V] under target-only sampling, from the target's own logits (on
    whatever device and dtype it runs)."""
    vocab, device = target.model.config.vocab_size, target.model.device

    def probs(text):
        with torch.no_grad():
            logits = target.model(torch.tensor([text], device=device)).logits[:, -1].float().cpu()
        return logits_to_probs(penalize_repeats(logits, text, [], params)[0], params)

    first = probs(prompt)
    joint = torch.zeros(vocab, vocab)
    for t1 in range(vocab):
        joint[t1] = first[t1] * probs(prompt + [t1])
    return joint


def noise(expected: torch.Tensor, samples: int) -> float:
    """The total variation sampling noise alone gives `samples` draws: E[TV] ~ 0.5 * sum of
    sqrt(2 p (1 - p) / (pi N)) over the cells."""
    return 0.5 * sum((2 * p * (1 - p) / (torch.pi * samples)) ** 0.5 for p in expected.flatten().tolist())
