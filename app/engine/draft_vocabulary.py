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

Answers in other languages leave the subset often: in the 8 translation prompts' answers (French,
German, Spanish, Italian, Portuguese) 60 of 277 tokens lay outside it and were corrections the
draft could never have offered. An answer that has shown that (see WIDEN_OUTSIDE, WIDEN_SHARE)
is drafted over the whole vocabulary for the rest of the request, and so is the next request
from its start (a user who writes in French goes on writing in French); an answer that stays
inside the subset returns the next request to it.
"""
from __future__ import annotations

import torch

from .choices import COMMON_TOKENS
from .models.lean_decoder import LeanDecoder
from .lowbit import kernel
from .lowbit.modules import LowBitLinear
from .lowbit.packing import ROWS_MULTIPLE, TILE

BLOCK = ROWS_MULTIPLE  # token ids per unit of the subset
# The whole vocabulary is drafted once at least WIDEN_OUTSIDE of the answer's tokens, and at least
# WIDEN_SHARE of them, lay outside the subset when the target emitted them. The default pair's
# translations reach that within 4-18 tokens (speculation 1.113x against 1.057x plain without
# widening); its GSM8K, MMLU and CNN/DM answers have 0.4-2.3% of their tokens outside and hardly
# ever widen; open chat often does, and code now and then, at no measurable cost or gain. The
# whole output layer makes a draft token about a fifth dearer.
WIDEN_OUTSIDE = 3
WIDEN_SHARE = 0.1


class DraftVocabulary:
    def __init__(self, head: LowBitLinear, vocab_width: int, common: int = COMMON_TOKENS) -> None:
        """head: the draft's output layer; vocab_width: the vocabulary draft and target share."""
        self.head = head
        self.width = vocab_width
        self.common_blocks = common // BLOCK
        self.common = self.common_blocks * BLOCK
        self.all_blocks = -(-vocab_width // BLOCK)
        self._answered = self._outside = 0  # the answer's tokens, and those outside the subset when emitted
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
        """A new request: the common tokens and those of `token_ids` (the prompt); the whole
        vocabulary if the last answer left the subset often."""
        self._known = set(range(self.common_blocks))
        self._extra_blocks: list[int] = []
        self._stale = True
        self.whole = self._left_subset()  # drafting over the whole vocabulary
        self._answered = self._outside = 0
        self.add(token_ids)

    def add(self, token_ids: list[int]) -> None:
        """Tokens the conversation now holds: their blocks join the subset."""
        new = {t // BLOCK for t in token_ids if 0 <= t < self.width} - self._known
        if new:
            self._known |= new
            self._extra_blocks += sorted(new)
            self._stale |= not self.whole  # the whole vocabulary holds them already

    def answered(self, token_ids: list[int]) -> None:
        """Tokens that joined the answer (drafted, looked up, the target's own)."""
        self._answered += len(token_ids)
        for token in token_ids:  # one at a time: a second token of a new block is inside
            if 0 <= token < self.width and token // BLOCK not in self._known:
                self._outside += 1
                self.add([token])
        if not self.whole and self._left_subset():
            self.whole, self._stale = True, True

    def _left_subset(self) -> bool:
        return self._outside >= max(WIDEN_OUTSIDE, WIDEN_SHARE * self._answered)

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

    def columns_of(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [n] -> the columns of `logits` that hold those of them in the subset [m <= n]."""
        self._gather()
        token_ids = token_ids[token_ids < self.width]
        at = self._block_at[token_ids // BLOCK]
        inside = at >= 0
        return at[inside] * BLOCK + token_ids[inside] % BLOCK

    def spread(self, probs: torch.Tensor) -> torch.Tensor:
        """probs [n, S] over the subset -> [n, V] over the whole vocabulary (zero outside)."""
        # Added, not copied: a padding column shares its id with a real token and adds exactly 0.
        return probs.new_zeros(probs.shape[0], self.width).index_add_(1, self.ids, probs)

    def _gather(self) -> None:
        if not self._stale:
            return
        common_blocks = self.all_blocks if self.whole else self.common_blocks
        self._common = self.head.packed.tiles(slice(0, common_blocks * BLOCK // TILE))  # a view, never copied
        extra = torch.tensor([] if self.whole else self._extra_blocks, dtype=torch.long)
        tiles = (extra[:, None] * (BLOCK // TILE) + torch.arange(BLOCK // TILE)).flatten()
        self._extra = self.head.packed.tiles(tiles) if len(extra) else None
        blocks = torch.cat([torch.arange(common_blocks), extra])
        self._block_at = torch.full((self.all_blocks,), -1, dtype=torch.long)  # each block's place in the subset
        self._block_at[blocks] = torch.arange(len(blocks))
        ids = (blocks[:, None] * BLOCK + torch.arange(BLOCK)).flatten()
        padding = ids >= self.width  # ids past the vocabulary in its last block: their logits are -inf
        self._padding = padding if padding.any() else None
        self._ids = ids.clamp_(max=self.width - 1)
        self._stale = False
