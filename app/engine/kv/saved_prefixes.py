"""Copies of a model's cache kept on disk between runs of the app.

The kept copies of prefix_cache.py live in memory, so a chat reopened after a restart had its
whole conversation read again before the first token of a follow-up: 11 s for a 2,170-token
chat on 2 CPU cores. When the window closes, the engine writes each model's cache and its kept
copies here; the next run's requests (and read-aheads) take a copy back as they take one from
memory, and read only what the prompt adds. A restored copy holds the very keys and values the
conversation left (on the low-bit path, the ones a fresh read computes, bit for bit), so the
answer is the one a fresh read gives.

Each model has its own folder, named by a fingerprint of its weights, precision, cache type,
kernel build and device, so a copy is never offered to another model. A folder keeps up to
MAX_TOKENS tokens and all folders together up to MAX_BYTES, the copies most recently saved or used
first. No token ids are stored (a copy is found by digests of its prefixes at every BLOCK tokens),
but the keys and values are the conversation in another form (the first layer's turn back into
its tokens with the model's public weights): the folders are owner-only, like the chats, and a
deleted chat's copies are deleted with it (forget). A copy that cannot be written or read only
means that its conversation is read again.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from ..files import private_folder, remove_abandoned, replaced
from .kept_prefixes import MIN_TOKENS, Snapshot

BLOCK = 64  # copies are matched a block at a time: at most BLOCK - 1 of their tokens are read again
MAX_TOKENS = 8192  # per model: 235 MB for the default target, 100 MB for its draft
# All models' copies together (models used before keep theirs), the least recently used going first:
# beside the default pair's prepared weights (1.49 GB) the cache folder stays within 2 GB.
MAX_BYTES = 480 << 20
INDEX = "index.json"
UNKNOWN = -1  # the id of a restored token past the blocks a prompt matched: matches no real token
DIGEST = re.compile(r"[0-9a-f]{32}")  # a copy's file is named by one: an index naming anything else is damaged


def prefix_digests(token_ids: list[int]) -> list[str]:
    """The digest of token_ids[: BLOCK * (i + 1)] for each whole block i, in order."""
    running, digests = hashlib.sha256(), []
    for start in range(0, len(token_ids) - BLOCK + 1, BLOCK):
        running.update(struct.pack(f"<{BLOCK}q", *token_ids[start : start + BLOCK]))
        digests.append(running.copy().hexdigest()[:32])
    return digests


def matched_blocks(digests: list[str], others: list[str]) -> int:
    """How many whole blocks two prompts share, from their prefix digests."""
    shared = min(len(digests), len(others))
    # a prefix's digest covers every block before it, so the last equal one says it all
    return next((n for n in range(shared, 0, -1) if digests[n - 1] == others[n - 1]), 0)


def model_fingerprint(model: torch.nn.Module, *parts: str) -> str:
    """A digest of what makes a model's cache: its configuration, each weight's name, shape and
    first and last bytes (enough to tell two models apart without reading a gigabyte), and
    `parts` (precision, cache type, kernel build, device)."""
    digest = hashlib.sha256("|".join(parts).encode())
    digest.update(model.config.to_json_string(use_diff=False).encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        if tensor.is_contiguous() and tensor.numel():
            flat = tensor.detach().reshape(-1)
            for part in (flat[:16], flat[-16:]):
                digest.update(part.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:24]


@dataclass
class Entry:
    digests: list[str]  # of its prefixes, one per whole block
    tokens: int  # the tokens its file holds (the last block may be partial)

    @property
    def name(self) -> str:
        return self.digests[-1]


class SavedPrefixes:
    """One model's copies on disk: `folder`/<digest of a copy's tokens>.pt (its cache state, as
    the cached model's snapshot() gives it) and an index of their prefix digests."""

    def __init__(self, folder: Path, max_tokens: int = MAX_TOKENS) -> None:
        self.folder, self.max_tokens = folder, max_tokens
        self.entries = self._read_index()

    def restore_into(self, model, token_ids: list[int], cached: int) -> bool:
        """Restores into a cached model the copy sharing the most whole blocks with token_ids,
        when that is at least MIN_TOKENS more than the `cached` tokens its cache holds; the
        copy's tokens past those blocks are UNKNOWN (the caller rolls the cache back to what the
        prompt shares). False when none serves, or when the one that would cannot be read or does
        not fit the cache: it is dropped, and the cache emptied (a failed restore may have
        overwritten part of it)."""
        digests = prefix_digests(token_ids)
        best = max(self.entries.values(), key=lambda e: matched_blocks(digests, e.digests), default=None)
        shared = BLOCK * matched_blocks(digests, best.digests) if best else 0
        if shared < cached + MIN_TOKENS:
            return False
        path = self.folder / f"{best.name}.pt"
        try:
            state = torch.load(path, weights_only=True)
            os.utime(path)  # recently used: kept longest
        except Exception:  # unreadable or damaged: read the conversation again
            self._drop(best)
            self._write_index()
            return False
        try:
            model.restore(Snapshot(token_ids[:shared] + [UNKNOWN] * (best.tokens - shared), state))
            return True
        except Exception:  # not this cache's shapes (a tampered file, say)
            model.reset()
            self._drop(best)
            self._write_index()
            return False

    def save(self, snapshots: list[Snapshot]) -> None:
        """Writes the copies (most recent first; none longer than max_tokens) not yet on disk,
        then lets the least recently saved or used copies go while all hold more than max_tokens."""
        for snapshot in reversed(snapshots):  # the oldest first: the files' times then order them
            digests = prefix_digests(snapshot.ids)
            if BLOCK * len(digests) < MIN_TOKENS or len(snapshot.ids) > self.max_tokens:
                continue
            holder = next((e for e in self.entries.values() if matched_blocks(digests, e.digests) == len(digests)), None)
            if holder is not None:  # already on disk (in this copy or a longer one)
                self._touch(holder)
                continue
            entry = Entry(digests, len(snapshot.ids))
            if not self._write(entry, snapshot.state):
                break  # a full disk, say: the rest would fail too
            for contained in [e for e in self.entries.values() if matched_blocks(digests, e.digests) == len(e.digests)]:
                self._drop(contained)
            self.entries[entry.name] = entry
        by_age = sorted(self.entries.values(), key=self._used, reverse=True)
        total = 0
        for entry in by_age:
            total += entry.tokens
            if total > self.max_tokens:
                self._drop(entry)
        self._write_index()
        remove_abandoned(self.folder)  # a killed run's unfinished writes
        for stray in self.folder.glob("*.pt"):  # another run's copies that this index lost
            if stray.stem not in self.entries:
                _remove(stray)

    def forget(self, token_ids: list[int]) -> None:
        """Deletes every copy that shares a whole block with token_ids (a deleted chat's)."""
        digests = prefix_digests(token_ids)
        shared = [e for e in self.entries.values() if matched_blocks(digests, e.digests)]
        for entry in shared:
            self._drop(entry)
        if shared:
            self._write_index()

    def _used(self, entry: Entry) -> float:
        try:
            return (self.folder / f"{entry.name}.pt").stat().st_mtime
        except OSError:
            return 0.0

    def _touch(self, entry: Entry) -> None:
        try:
            os.utime(self.folder / f"{entry.name}.pt")
        except OSError:
            pass

    def _write(self, entry: Entry, state) -> bool:
        try:
            with replaced(private_folder(self.folder) / f"{entry.name}.pt") as partial:
                torch.save(state, partial)
            return True
        except (OSError, RuntimeError):
            return False

    def _drop(self, entry: Entry) -> None:
        self.entries.pop(entry.name, None)
        _remove(self.folder / f"{entry.name}.pt")

    def _read_index(self) -> dict[str, Entry]:
        try:
            data = json.loads((self.folder / INDEX).read_text(encoding="utf-8"))
            entries = [Entry(list(e["digests"]), int(e["tokens"])) for e in data["entries"]]
            if not all(isinstance(d, str) and DIGEST.fullmatch(d) for e in entries for d in e.digests):
                raise ValueError("not a digest")  # a name that could reach outside the folder
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        return {e.name: e for e in entries if e.digests and (self.folder / f"{e.name}.pt").is_file()}

    def _write_index(self) -> None:
        path = self.folder / INDEX
        if not self.entries and not path.exists():
            return  # nothing saved here yet: no folder for it
        data = {"entries": [{"digests": e.digests, "tokens": e.tokens} for e in self.entries.values()]}
        try:
            private_folder(self.folder)
            with replaced(path) as partial:
                partial.write_text(json.dumps(data), encoding="utf-8")
        except OSError:
            pass


def _remove(path: Path) -> None:
    """Deletes a file if it can (a read-only folder keeps it: it is only a copy)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def stores_under(root: Path, open_stores: list[SavedPrefixes]) -> list[SavedPrefixes]:
    """Every model's store under `root`: the open ones as they are, the others read from disk."""
    by_folder = {store.folder: store for store in open_stores}
    folders = sorted(path for path in root.iterdir() if path.is_dir()) if root.is_dir() else []
    return [by_folder.get(folder) or SavedPrefixes(folder) for folder in folders]


def trim(root: Path, max_bytes: int = MAX_BYTES) -> None:
    """Deletes the least recently saved or used copies under `root`, of any model, while all hold
    more than max_bytes (an index naming a deleted file drops it when next read)."""
    files = []
    for path in root.glob("*/*.pt"):
        try:
            info = path.stat()
        except OSError:
            continue
        files.append((info.st_mtime, info.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        _remove(path)
        total -= size
