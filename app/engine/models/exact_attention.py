"""Attention that gives each verified token exactly what decoding it alone gives, for models that
run through transformers' forward (the architectures the lean decoder does not run: Gemma, Phi-3,
Mistral's sliding window, ...).

transformers attends a verification's n new query rows in one call, whose order of operations
changes with n: a verified token's logits could differ in their last bits from decoding it alone
(by up to 1.4e-6 on a tiny Phi-3 model), enough to flip a greedy near-tie. The implementations
here wrap the model's own (sdpa or eager): asked for `exact_rows`, they attend each row in its own
call over the keys decoding it alone is handed (those up to it; a sliding window's only), with the
mask decoding gets, as the lean decoder's rows are computed.
"""
from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

WRAPPED = {"sdpa": "specchat_exact_rows_sdpa", "eager": "specchat_exact_rows_eager"}


def use_exact_rows(model: torch.nn.Module) -> bool:
    """Makes the model attend through the wrapper of its implementation; whether it now does."""
    name = model.config._attn_implementation
    if name in WRAPPED.values():
        return True
    if name not in WRAPPED or (name == "eager" and not hasattr(sys.modules[type(model).__module__],
                                                                 "eager_attention_forward")):
        return False  # flash attention and others (GPU only), or an eager one we cannot call: left as they are
    model.config._attn_implementation = WRAPPED[name]
    return True


def _original(module: torch.nn.Module, name: str):
    # eager attention is each modeling file's own function (Gemma 2's caps its scores, for one)
    return sdpa_attention_forward if name == "sdpa" else sys.modules[type(module).__module__].eager_attention_forward


def _decoding_mask(mask: torch.Tensor | None, name: str) -> torch.Tensor | None:
    """One row's mask as decoding passes it: sdpa decodes with no mask where every key is seen."""
    if name == "sdpa" and mask is not None and mask.dtype == torch.bool and bool(mask.all()):
        return None
    return mask


def _first_seen(mask: torch.Tensor | None) -> int:
    """The first key a row's mask [1, 1, 1, end] lets it see, where it sees every key from there on
    (a sliding window): decoding is handed only those keys, from a cache that keeps the window."""
    if mask is None:
        return 0
    seen = (mask if mask.dtype == torch.bool else mask == 0).flatten()
    first = int(seen.to(torch.uint8).argmax())
    return first if bool(seen[first:].all()) else 0


def _rows(name: str):
    def attention(module, query, key, value, attention_mask, exact_rows: bool = False, **kwargs):
        """query [b, heads, n, head_dim]; key, value [b, kv_heads, L, head_dim], the n new
        positions last; attention_mask [b, 1, n, L] or None -> ([b, n, heads, head_dim], None)."""
        original = _original(module, name)
        n, length = query.shape[2], key.shape[2]
        if n == 1:
            return original(module, query, key, value, _decoding_mask(attention_mask, name), **kwargs)
        if not exact_rows:  # a prompt: no logits of its rows are kept but the last
            return original(module, query, key, value, attention_mask, **kwargs)
        rows = []
        for i in range(n):
            end = length - n + i + 1
            mask = None if attention_mask is None else attention_mask[:, :, i : i + 1, :end]
            first = _first_seen(mask)
            mask = None if mask is None else mask[..., first:]
            row, _ = original(module, query[:, :, i : i + 1], key[:, :, first:end].contiguous(),
                              value[:, :, first:end].contiguous(), _decoding_mask(mask, name), **kwargs)
            rows.append(row)
        return torch.cat(rows, dim=1), None

    return attention


for _name, _wrapper in WRAPPED.items():
    AttentionInterface.register(_wrapper, _rows(_name))
    ALL_MASK_ATTENTION_FUNCTIONS.register(_wrapper, ALL_MASK_ATTENTION_FUNCTIONS[_name])
