"""What a request keeps of earlier requests' caches, so that it reads only what its prompt adds.

Each model has one KV cache, and a request keeps what it holds of its prompt (keep_prefix): the
conversation so far, a regenerated answer's prompt. That alone served one chat at a time: a
user who asks something in another chat and then returns had the first conversation read again
from its start: 25 s for a 2,800-token one on 2 CPU cores. Before a request lets a long stretch
of the cache go, a copy of it is kept here; a later prompt that shares more with a kept copy than
with the live cache gets the copy back. The copies are exact: a restored cache is the one the
conversation left, so an answer is the one it would have been had the user never left the chat
(and on the low-bit path, where every path computes the cache bit for bit alike, the one a
fresh read of the whole prompt gives).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import psutil

MIN_TOKENS = 64  # a shorter stretch is read again in well under a second
MAX_TOKENS = 4096  # per model, all copies together: 235 MB for the default target, 100 MB for its draft
# Copies are a convenience: they never leave the machine less memory than this (the oldest go).
RESERVE_BYTES = 1 << 30


def available_bytes() -> int:
    return psutil.virtual_memory().available


@dataclass
class Snapshot:
    ids: list[int]  # the tokens whose keys and values it holds, in order
    state: object  # the cached model's own copy of those keys and values
    nbytes: int = 0  # the memory that copy takes


class PrefixStore:
    def __init__(self, max_tokens: int = MAX_TOKENS, available: Callable[[], int] = available_bytes) -> None:
        self.max_tokens = max_tokens
        self.available = available  # the machine's free memory now, in bytes
        self.snapshots: list[Snapshot] = []  # least recently kept first

    @property
    def tokens(self) -> int:
        return sum(len(s.ids) for s in self.snapshots)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.snapshots)

    def clear(self) -> None:
        self.snapshots.clear()

    def keep(self, snapshot: Snapshot) -> None:
        """Keep a copy; copies it contains (their tokens begin it) go, and the oldest go while
        the copies hold more than max_tokens or the machine has less than RESERVE_BYTES free
        (the new copy too, last)."""
        self.snapshots = [s for s in self.snapshots if s.ids != snapshot.ids[: len(s.ids)]] + [snapshot]
        while self.snapshots and (self.tokens > self.max_tokens or self.available() < RESERVE_BYTES):
            del self.snapshots[0]

    def forget(self, token_ids: list[int]) -> None:
        """Let every copy go that shares at least MIN_TOKENS tokens with token_ids (a deleted chat's)."""
        self.snapshots = [s for s in self.snapshots if common_prefix(s.ids, token_ids) < MIN_TOKENS]

    def take(self, token_ids: list[int], cached: int) -> Snapshot | None:
        """The copy sharing the longest beginning with token_ids, out of the store, when it
        shares at least MIN_TOKENS more than the `cached` tokens the live cache shares."""
        best = max(self.snapshots, key=lambda s: common_prefix(s.ids, token_ids), default=None)
        if best is None or common_prefix(best.ids, token_ids) < cached + MIN_TOKENS:
            return None
        self.snapshots.remove(best)
        return best


def common_prefix(a, b) -> int:
    """The length of the longest common prefix of two token id sequences."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def keep_prefix(model, token_ids: list[int]) -> int:
    """Roll a cached model (either kind) back to the longest common prefix of token_ids and
    what its cache holds, or a kept copy holds; returns that prefix's length (the tokens it need
    not read again). A long stretch the rollback lets go is kept as a copy first."""
    if not model.reuses_prefix:  # rolling it far back would break its cache: start afresh
        model.reset()
        return 0
    kept = common_prefix(model.ids, token_ids)
    if model.length - kept >= MIN_TOKENS:
        model.prefixes.keep(model.snapshot(model.prefixes.max_tokens))
    earlier = model.prefixes.take(token_ids, kept)
    if earlier is not None:
        model.restore(earlier)
        kept = common_prefix(model.ids, token_ids)
    elif model.saved is not None:
        model.saved.restore_into(model, token_ids, kept)  # an earlier run's copy, where one serves
        kept = common_prefix(model.ids, token_ids)  # (none if a copy that did not fit emptied the cache)
    model.rollback(kept)
    return kept
