"""One logits -> probabilities function, shared by draft and target.

Under greedy decoding (temperature 0) the probabilities are the model's plain softmax and
`sample` takes their argmax: the choice is greedy, while the numbers stay meaningful for
display and for confidence-based draft stopping.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .choices import SamplingParams


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probs [..., V] float32, after temperature, top-k, top-p and min-p (in
    that order, as transformers' generate applies them)."""
    logits = logits.float()
    if params.greedy:
        return logits.softmax(-1)
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        logits = _nucleus(logits, params.top_p)
    if params.min_p > 0.0:
        # p < min_p * p_max, in logits: logit < max logit + log(min_p)
        floor = logits.max(dim=-1, keepdim=True).values + math.log(params.min_p)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    return logits.softmax(-1)


def penalize_repeats(logits: torch.Tensor, text: list[int], following: list[int], params: SamplingParams,
                     columns_of: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """logits [rows, V], row i scoring the token after text + following[:i] -> the same with
    llama.cpp's repeat penalty: in each row, every token among the last params.repeat_last_n of
    its text has its logit divided by the penalty where positive and multiplied where not. The
    same tensor when the penalty is off. columns_of: token ids [n] -> the columns holding them
    (a draft over part of the vocabulary); without it the column is the id.

    Draft and target penalise alike; exactness needs only that the target's rows see the very
    text plain decoding would give them, which row i's (text + the draft tokens before it) is."""
    penalty, last_n = params.repeat_penalty, params.repeat_last_n
    if penalty == 1.0:
        return logits
    logits = logits.float().clone()
    recent = text[-last_n:] + following  # row i looks at the last_n before recent[len(text window) + i]
    for row in range(logits.shape[0]):
        end = len(recent) - len(following) + row
        ids = torch.tensor(sorted(set(recent[max(0, end - last_n) : end])), dtype=torch.long)
        columns = (ids if columns_of is None else columns_of(ids)).to(logits.device)
        scores = logits[row, columns]
        logits[row, columns] = torch.where(scores > 0, scores / penalty, scores * penalty)
    return logits


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """logits [..., V] -> the same with every token outside its row's nucleus at -inf: the most
    likely tokens, each kept while those before it fall short of top_p (the first always stays).
    Sorting all 151,936 logits took 12 ms a row here; the nucleus nearly always lies within the
    64 or 1,024 largest, which topk finds in 0.3 or 0.7 ms, so the whole sort is the last resort."""
    probs = logits.softmax(-1)
    vocab = logits.shape[-1]
    for width in (64, 1024, vocab):
        top_probs, top_ids = probs.topk(min(width, vocab), dim=-1)  # sorted, largest first
        keep = top_probs.cumsum(-1) - top_probs < top_p
        if width >= vocab or not keep[..., -1].any():  # every row's nucleus ended within these
            break
    kept = torch.where(keep, logits.gather(-1, top_ids), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(-1, top_ids, kept)


def sample(probs: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """probs [..., V] -> token ids [...] (argmax when greedy)."""
    if params.greedy:
        return argmax(probs)
    return draw(probs, generator)


def argmax(values: torch.Tensor) -> torch.Tensor:
    """values [..., V] -> the index of each row's largest value [...], the first of equals (as
    torch.argmax). On the CPU through numpy, whose vectorised argmax took 0.013 ms a row of
    151,936 floats here against torch's 0.275 (about 1 ms of every 5-token verification)."""
    if values.device.type != "cpu" or values.dtype != torch.float32:
        return values.argmax(-1)
    return torch.from_numpy(np.asarray(values.contiguous().numpy().argmax(-1)))


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """probs [..., V] (need not sum to 1) -> token ids [...], one random draw per row: the first
    token whose cumulative probability exceeds a uniform draw below the total, in float64 as
    torch.multinomial sums them (which took 3.4 ms a row over 151,936 tokens here, this 0.2)."""
    flat = probs.reshape(-1, probs.shape[-1])
    cumulative = torch.cumsum(flat, -1, dtype=torch.float64)
    total = cumulative[:, -1:]
    uniform = torch.rand(flat.shape[0], 1, generator=generator, dtype=torch.float64, device=flat.device)
    # Strictly below the total, so a token of probability 0 is never drawn (nor one past the end).
    point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, point, right=True).reshape(probs.shape[:-1])
