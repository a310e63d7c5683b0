"""A model with its KV cache, as the loop, the proposers and the engine use it (the Decoder
protocol), and the choice of implementation for a model: the lean decoder (lean_decoder.py) for
low-bit Llama, Qwen2, Qwen3 and Gemma models, transformers' forward (transformers_decoder.py)
for the rest.

A decoder remembers which tokens its cache holds (`ids`) and copies the cache out and back
(snapshot, restore), so a request keeps what earlier ones left (kv/kept_prefixes.keep_prefix)."""
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

import torch

from ..devices import synchronize

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..kv.kept_prefixes import PrefixStore, Snapshot
    from ..kv.saved_prefixes import SavedPrefixes


class Decoder(Protocol):
    model: PreTrainedModel
    device: torch.device
    ids: list[int]  # the tokens the cache holds, in order
    prefixes: PrefixStore  # copies of earlier conversations' caches, kept in memory
    saved: SavedPrefixes | None  # its copies on disk, where the engine keeps them (None: not kept)
    reuses_prefix: bool  # its cache can be cut back to any length, so a request keeps a shared prefix
    cache_dtype: torch.dtype | None  # what its own KV cache holds (None: transformers' cache)

    @property
    def length(self) -> int: ...

    @property
    def bytes_per_token(self) -> int:
        """What each token adds to the cache."""

    @property
    def cache_bytes(self) -> int:
        """The memory the live cache takes."""

    def reset(self) -> None: ...

    def forward(self, token_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """token_ids [n] long, appended to the cache -> logits [keep, V] of the last `keep` of them."""

    def feed(self, token_ids: torch.Tensor) -> None:
        """token_ids [n] long into the cache, no logits."""

    def rollback(self, length: int) -> None:
        """The cache keeps its first `length` tokens."""

    def snapshot(self, max_tokens: int) -> Snapshot: ...

    def restore(self, snapshot: Snapshot) -> None: ...


def cached(model: PreTrainedModel, vocab_width: int | None = None, cache_dtype: torch.dtype | None = None) -> Decoder:
    """The cached forward a model runs with: the lean decoder for low-bit Llama/Qwen2/Qwen3/Gemma 3
    models, with the kernel or without it (cache_dtype: its native KV cache's, see lean_decoder),
    transformers' own forward otherwise (every float model: the reference path)."""
    from ..lowbit.fallback import Int8Linear
    from ..lowbit.modules import LowBitLinear
    from . import lean_decoder
    from .transformers_decoder import TransformersDecoder

    if lean_decoder.supports(model) and any(isinstance(m, (LowBitLinear, Int8Linear)) for m in model.modules()):
        return lean_decoder.LeanDecoder(model, vocab_width, cache_dtype)
    return TransformersDecoder(model, vocab_width)


def pass_seconds(model, sizes: Iterable[int], vocabulary=None, context: int = 32, repeats: int = 2) -> dict[int, float]:
    """Seconds of one cached forward over n new tokens after `context` cached ones (best of
    `repeats`), for each n in `sizes`; with a draft's vocabulary, as the draft runs. The context
    is fed once and each pass rolled back, so the timing costs little more than the passes
    themselves; the cache is left empty. Each round times every size once: a slow moment of
    the machine (its memory bandwidth moves by a third here from minute to minute) then slows
    one round of all sizes, not all repeats of one size, and the sizes' ratios stay fair."""
    over = {} if vocabulary is None else {"vocabulary": vocabulary}
    vocab = model.model.config.vocab_size
    model.reset()
    model.feed(torch.arange(context) % vocab)
    seconds = {}
    for _ in range(repeats):
        for n in sizes:
            model.rollback(context)
            start = time.perf_counter()
            model.forward(torch.arange(n) % vocab, keep=n, **over)
            synchronize(model.device)
            seconds[n] = min(seconds.get(n, float("inf")), time.perf_counter() - start)
    model.reset()
    return seconds
