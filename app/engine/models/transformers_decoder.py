"""A model that transformers runs, with its KV cache (a Decoder, see decoder.py): every float
model, and low-bit architectures the lean decoder does not know. Rollback crops the cache."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..memory_check import cache_bytes_per_token
from ..kv.kept_prefixes import PrefixStore, Snapshot

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class TransformersDecoder:
    cache_dtype = None  # transformers' own cache, in the model's dtype

    def __init__(self, model: PreTrainedModel, vocab_width: int | None = None) -> None:
        self.model = model
        self.device = model.device
        # Logits beyond the shared vocabulary (embedding padding) are never real tokens.
        self.vocab_width = vocab_width
        self.prefixes = PrefixStore()
        self.saved = None  # its copies on disk, where the engine keeps them
        # On the CPU a verified token's attention is computed as decoding it alone computes it
        # (exact_attention): with the low-bit kernel's batch-invariant linears, greedy speculative
        # output then equals plain output. A GPU keeps one call for all rows (its matrix products
        # are not batch invariant either).
        # Imported here: transformers' attention code takes seconds to import, and the lean
        # decoder, which runs the default pair, never needs it.
        from . import exact_attention

        self.exact_rows = self.device.type == "cpu" and exact_attention.use_exact_rows(model)
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicSlidingWindowLayer

        self.cache = DynamicCache(config=self.model.config)
        # Sliding-window layers (Mistral, Gemma 2/3 style) keep only the window unless they record
        # the past; recording keeps the rejected tail until rollback crops it.
        self.cache.activate_past_recording()
        self.ids: list[int] = []  # the tokens whose keys and values are in the cache, in order
        # Cropping a sliding-window layer far back breaks its shapes (transformers 5), so such a
        # model keeps nothing from one request to the next; rollbacks within a step are short.
        self.reuses_prefix = not any(isinstance(layer, DynamicSlidingWindowLayer) for layer in self.cache.layers)

    @property
    def length(self) -> int:
        return len(self.ids)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """token_ids [n] long, appended to the cache -> logits [keep, V] float32 of the last positions."""
        try:
            out = self.model(
                input_ids=token_ids.view(1, -1).to(self.device),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=keep,
                **({"exact_rows": keep > 1} if self.exact_rows else {}),
            )
        except BaseException:
            self.reset()  # some layers may hold the new tokens and others not: nothing there is reusable
            raise
        self.ids += token_ids.tolist()
        return out.logits[0, -keep:, : self.vocab_width].float()

    def feed(self, token_ids: torch.Tensor) -> None:
        """token_ids [n] long, appended to the cache; no logits wanted (a prefill, a catch-up)."""
        self.forward(token_ids, keep=1)  # transformers' forward computes one row of logits at least

    def rollback(self, length: int) -> None:
        """Forget everything after the first `length` cached tokens (called after every step)."""
        if 0 < self.length and length <= self.length:  # an empty cache has nothing to crop (nor its layers' shapes)
            # transformers 5: a negative count removes tokens; 0 trims sliding-window layers back
            # to their window and is a no-op for the others
            self.cache.crop(length - self.length)
            del self.ids[length:]

    @torch.inference_mode()
    def snapshot(self, max_tokens: int) -> Snapshot:
        """A copy of the cache's first max_tokens tokens."""
        n = min(self.length, max_tokens)
        state = [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone()) for layer in self.cache.layers]
        return Snapshot(self.ids[:n], state, sum(k.nbytes + v.nbytes for k, v in state))

    @property
    def bytes_per_token(self) -> int:
        """What each token adds to the cache."""
        return cache_bytes_per_token(self.model.config, next(self.model.parameters()).element_size())

    @property
    def cache_bytes(self) -> int:
        """The memory the live cache takes."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.cache.layers
                   if getattr(layer, "keys", None) is not None)

    @torch.inference_mode()
    def restore(self, snapshot: Snapshot) -> None:
        """The cache becomes the snapshot's (which stays unchanged)."""
        self.reset()
        for index, (keys, values) in enumerate(snapshot.state):
            self.cache.update(keys.clone(), values.clone(), index)
        self.ids = list(snapshot.ids)
