"""One logits -> probabilities function, shared by draft and target.

Under greedy decoding (temperature 0) the probabilities are the model's plain softmax and
`sample` takes their argmax: the choice is greedy, while the numbers stay meaningful for
display and for confidence-based draft stopping.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probs [..., V] float32, after temperature, top-k and top-p."""
    logits = logits.float()
    if params.greedy:
        return logits.softmax(-1)
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token once the tokens before it already reach top_p; the first always stays.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= params.top_p, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits.softmax(-1)


def sample(probs: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """probs [..., V] -> token ids [...] (argmax when greedy)."""
    if params.greedy:
        return probs.argmax(-1)
    return draw(probs, generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """probs [..., V] -> token ids [...], one random draw per row."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
