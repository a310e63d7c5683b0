"""The tokens a low-bit draft model may propose: a smaller output layer for a cheaper draft.

The draft's output layer over all 151,936 tokens is about a quarter of a draft pass (80 of
285 MB of 4-bit weights read per drafted token). Drafting over a subset reads a fraction of it:
the first `common` token ids (byte-pair merges are numbered in the order they were learnt, most
frequent first, so low ids are the common tokens) plus every token of the conversation, the
prompt and what was committed since, in blocks of 32 ids (the packed weight's unit: a block is
two output tiles, so the common part is a view and the rest a small gather). On the default
pair's GSM8K, MMLU and CNN/DM answers, 98.6%, 97.7% and 99.6% of the target's tokens lie in
the first 32,768 ids or a block the conversation touched before them.

The target still decides every token, so output never changes: a token outside the subset is
never drafted, the target emits it (a correction) and from then on its block is in. Rejection
sampling stays exact: the draft samples from its own distribution over the subset, zero
elsewhere, and reports that distribution.
"""
from __future__ import annotations

import torch

from .lean_decoder import LeanDecoder
from .lowbit import kernel
from .lowbit.modules import LowBitLinear
from .lowbit.packing import ROWS_MULTIPLE, TILE

BLOCK = ROWS_MULTIPLE  # token ids per unit of the subset
COMMON_TOKENS = 32768  # the default: a fifth of the default pair's vocabulary


class DraftVocabulary:
    def __init__(self, head: LowBitLinear, vocab_width: int, common: int = COMMON_TOKENS) -> None:
        """head: the draft's output layer; vocab_width: the vocabulary draft and target share."""
        self.head = head
        self.width = vocab_width
        self.common_blocks = common // BLOCK
        self.common = self.common_blocks * BLOCK
        weight = head.packed
        self._common = weight.tiles(slice(0, self.common // TILE))  # a view, never copied
        self.reset([])

    @staticmethod
    def for_draft(decoder, vocab_width: int, common: int = COMMON_TOKENS) -> DraftVocabulary | None:
        """A subset for a draft whose output layer is low-bit and larger than `common` tokens,
        else None (the full vocabulary: nothing to save). decoder: the draft's cached model."""
        head = getattr(decoder.model, "lm_head", None) if isinstance(decoder, LeanDecoder) else None
        if not isinstance(head, LowBitLinear) or not 0 < common // BLOCK * BLOCK < vocab_width:
            return None
        return DraftVocabulary(head, vocab_width, common)

    def reset(self, token_ids: list[int]) -> None:
        """A new conversation: the common tokens and those of `token_ids` (the prompt)."""
        self._known = set(range(self.common_blocks))
        self._extra_blocks: list[int] = []
        self._stale = True
        self.add(token_ids)

    def add(self, token_ids: list[int]) -> None:
        """Tokens the conversation now holds: their blocks join the subset."""
        new = {t // BLOCK for t in token_ids if 0 <= t < self.width} - self._known
        if new:
            self._known |= new
            self._extra_blocks += sorted(new)
            self._stale = True

    @property
    def ids(self) -> torch.Tensor:
        """[S] long: the token id of each column of `logits`."""
        self._gather()
        return self._ids

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, D] (the final normalised hidden states) -> logits [n, S] over the subset."""
        self._gather()
        logits = kernel.linear(hidden, self._common)
        if self._extra is not None:
            logits = torch.cat([logits, kernel.linear(hidden, self._extra)], dim=1)
        if self.head.bias is not None:
            logits = logits + self.head.bias[self._ids]
        if self._padding is not None:
            logits.masked_fill_(self._padding, float("-inf"))
        return logits

    def spread(self, probs: torch.Tensor) -> torch.Tensor:
        """probs [n, S] over the subset -> [n, V] over the whole vocabulary (zero outside)."""
        # Added, not copied: a padding column shares its id with a real token and adds exactly 0.
        return probs.new_zeros(probs.shape[0], self.width).index_add_(1, self.ids, probs)

    def _gather(self) -> None:
        if not self._stale:
            return
        extra = torch.tensor(self._extra_blocks, dtype=torch.long)
        tiles = (extra[:, None] * (BLOCK // TILE) + torch.arange(BLOCK // TILE)).flatten()
        self._extra = self.head.packed.tiles(tiles) if self._extra_blocks else None
        blocks = torch.cat([torch.arange(self.common_blocks), extra])
        ids = (blocks[:, None] * BLOCK + torch.arange(BLOCK)).flatten()
        padding = ids >= self.width  # ids past the vocabulary in its last block: their logits are -inf
        self._padding = padding if padding.any() else None
        self._ids = ids.clamp_(max=self.width - 1)
        self._stale = False
