"""Copies of the models' caches saved on disk when the app closes: the next run's follow-up in a
reopened chat reads only what it adds, and answers as a fresh read of the whole prompt does."""
import os

import pytest
import torch

from app.bench.speed import restarted_first_token
from app.engine.measuring import engine_run
from app.engine.engine import SpeculativeEngine
from app.engine.kv.kept_prefixes import MIN_TOKENS, Snapshot
from app.engine.kv.saved_prefixes import BLOCK, SavedPrefixes, prefix_digests, trim
from tests.helpers import all_steps, options
from tests.tiny import tiny_model, wide_low_bit

CHAT = [(7 * i) % 90 + 1 for i in range(2 * BLOCK + 20)]  # a chat of two whole blocks and some


def pair(kind: str) -> SpeculativeEngine:
    """A freshly loaded pair, as a new run of the app loads it (the same weights each time)."""
    if kind == "low-bit":
        return SpeculativeEngine(wide_low_bit(5, 8), wide_low_bit(5, 4))
    return SpeculativeEngine(tiny_model(seed=1), tiny_model(seed=1, init_range=0.21))


def answered(engine: SpeculativeEngine, prompt: list[int]) -> tuple[list[int], int]:
    """The answer's ids and how many prompt tokens the target found in its cache."""
    steps = all_steps(engine, prompt, k=4, max_new_tokens=24)
    return [token.id for step in steps for token in step.tokens], steps[-1].stats.cached_prompt_tokens


def saved_run(kind: str, folder) -> tuple[list[int], SpeculativeEngine]:
    """A run of the app that answers CHAT, then closes: its caches saved in `folder`."""
    engine = pair(kind)
    engine.keep_saved_caches(folder)
    answer, _ = answered(engine, CHAT)
    assert engine.save_caches()
    return CHAT + answer + [7, 8, 9], engine


@pytest.mark.parametrize("kind", ["low-bit", "float"])
def test_a_chat_saved_at_exit_is_not_read_again_after_a_restart(kind, tmp_path):
    follow_up, _ = saved_run(kind, tmp_path)
    restarted = pair(kind)
    restarted.keep_saved_caches(tmp_path)
    ids, cached = answered(restarted, follow_up)
    held = len(CHAT) + 24 - 1  # the chat and its answer but the answer's last token
    assert cached == held // BLOCK * BLOCK  # whole blocks are matched: the rest is read again
    assert restarted._draft.length >= cached  # the draft got its copy back too
    assert ids == answered(pair(kind), follow_up)[0]  # the answer a fresh read gives


def test_bench_speed_times_a_chat_reopened_after_a_restart():
    """bench speed's restart: the caches its last run left, saved and restored into an emptied
    engine, serve the same articles with another question; afterwards nothing is saved any more."""
    engine = pair("low-bit")
    engine_run(engine, options(k=4))(CHAT, 16)
    record = restarted_first_token(engine, options(k=4), CHAT[:-5] + [90, 91, 92])
    assert record["restored_tokens"] == (len(CHAT) - 5) // BLOCK * BLOCK
    assert engine._target.saved is None and engine._draft.saved is None  # no later run restores anything


def test_a_copy_is_offered_only_to_the_model_that_made_it(tmp_path):
    follow_up, _ = saved_run("low-bit", tmp_path)
    other = SpeculativeEngine(wide_low_bit(6, 8), wide_low_bit(6, 4))  # same shapes, other weights
    other.keep_saved_caches(tmp_path)
    assert answered(other, follow_up)[1] == 0
    coarser = SpeculativeEngine(wide_low_bit(5, 6), wide_low_bit(5, 6))  # the same model in 6 bits
    coarser.keep_saved_caches(tmp_path)
    assert answered(coarser, follow_up)[1] == 0


def test_a_damaged_copy_is_read_afresh_and_dropped(tmp_path):
    follow_up, _ = saved_run("low-bit", tmp_path)
    for path in tmp_path.rglob("*.pt"):
        path.write_bytes(b"not a cache")
    restarted = pair("low-bit")
    restarted.keep_saved_caches(tmp_path)
    ids, cached = answered(restarted, follow_up)
    assert cached == 0 and ids == answered(pair("low-bit"), follow_up)[0]
    assert not list(tmp_path.rglob("*.pt"))
    assert all(not store.entries for store in (restarted._target.saved, restarted._draft.saved))


def test_a_deleted_chat_leaves_no_copy_in_memory_or_on_disk(tmp_path):
    follow_up, engine = saved_run("low-bit", tmp_path)
    answered(engine, list(range(40, 60)))  # another chat: the first one's caches kept aside in memory
    assert engine._target.prefixes.snapshots
    assert engine.forget_conversation(follow_up)
    assert not engine._target.prefixes.snapshots and not engine._draft.prefixes.snapshots
    assert not list(tmp_path.rglob("*.pt"))
    assert answered(engine, follow_up)[1] == 0
    restarted = pair("low-bit")
    restarted.keep_saved_caches(tmp_path)
    assert answered(restarted, follow_up)[1] == 0


def test_a_deleted_chat_leaves_no_copy_of_models_used_before(tmp_path):
    """Copies another pair saved in an earlier run (the same tokenizer: the same token ids) go too."""
    follow_up, _ = saved_run("low-bit", tmp_path)
    now = SpeculativeEngine(wide_low_bit(6, 8), wide_low_bit(6, 4))
    now.keep_saved_caches(tmp_path)
    assert now.forget_conversation(follow_up)
    assert not list(tmp_path.rglob("*.pt"))


def test_all_models_copies_are_kept_within_one_limit(tmp_path):
    for model, name, used in [("a", "old", 1002), ("b", "older", 1001), ("a", "new", 1003)]:
        (tmp_path / model).mkdir(exist_ok=True)
        path = tmp_path / model / f"{name}.pt"
        path.write_bytes(b"x" * 100)
        os.utime(path, (used, used))
    trim(tmp_path, max_bytes=200)
    assert sorted(p.name for p in tmp_path.rglob("*.pt")) == ["new.pt", "old.pt"]
    trim(tmp_path, max_bytes=150)
    assert [p.name for p in tmp_path.rglob("*.pt")] == ["new.pt"]


def test_saved_copies_hold_no_token_ids(tmp_path):
    saved_run("low-bit", tmp_path)
    text = " ".join(path.read_text() for path in tmp_path.rglob("index.json"))
    assert text and str(CHAT[:6])[1:-1] not in text.replace("[", " ").replace("]", " ")


def test_a_copy_that_does_not_fit_the_cache_is_read_afresh_and_dropped(tmp_path):
    """A readable file of the wrong shapes under a copy's name (tampered with, say)."""
    follow_up, _ = saved_run("low-bit", tmp_path)
    for path in tmp_path.rglob("*.pt"):
        torch.save(([torch.zeros(3, 5)], [torch.zeros(2)]), path)
    restarted = pair("low-bit")
    restarted.keep_saved_caches(tmp_path)
    answered(restarted, CHAT[:10] + [5])  # the live cache holds the chat's first 10 tokens
    ids, cached = answered(restarted, follow_up)
    assert cached == 0 and ids == answered(pair("low-bit"), follow_up)[0]
    assert not list(tmp_path.rglob("*.pt"))


class Restored:
    """Stands in for a cached model's restore and reset: these tests are of the store's books."""

    def __init__(self) -> None:
        self.snapshot = None

    def restore(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def reset(self) -> None:
        self.snapshot = None


def taken(store: SavedPrefixes, token_ids: list[int], cached: int) -> Snapshot | None:
    model = Restored()
    return model.snapshot if store.restore_into(model, token_ids, cached) else None


def copy(tokens: int, first: int) -> Snapshot:
    ids = [first] + [(3 * i) % 50 + 1 for i in range(tokens - 1)]
    return Snapshot(ids, [torch.full((tokens,), float(first))])


def test_the_most_recent_copies_are_kept_within_the_limit(tmp_path):
    store = SavedPrefixes(tmp_path, max_tokens=3 * BLOCK - 1)
    store.save([copy(BLOCK, 1)])
    store.save([copy(BLOCK + 5, 2), copy(BLOCK, 3)])  # the most recent first
    assert {e.tokens for e in store.entries.values()} == {BLOCK + 5, BLOCK}
    reopened = SavedPrefixes(tmp_path)  # the next run finds the same
    assert {name: e.tokens for name, e in reopened.entries.items()} == {
        name: e.tokens for name, e in store.entries.items()}
    restored = taken(reopened, copy(BLOCK + 5, 2).ids + [9, 9], cached=0)
    assert restored.ids[:BLOCK] == copy(BLOCK, 2).ids and restored.ids[BLOCK:] == [-1] * 5
    assert torch.equal(restored.state[0], torch.full((BLOCK + 5,), 2.0))
    assert taken(reopened, copy(BLOCK, 4).ids, cached=0) is None  # nothing shares a block with it
    assert taken(reopened, copy(BLOCK, 2).ids + [9], cached=1) is None  # no MIN_TOKENS more than the live cache
    (tmp_path / "lost.pt").write_bytes(b"another run's copy, not in the index")
    longer = copy(2 * BLOCK, 2)  # begins as copy 2: it replaces it
    store.save([longer])
    assert {e.tokens for e in store.entries.values()} == {2 * BLOCK}  # copy 3 was the oldest: over the limit
    assert len(list(tmp_path.glob("*.pt"))) == 1


def test_a_full_disk_loses_nothing_but_the_copy(tmp_path, monkeypatch):
    store = SavedPrefixes(tmp_path)
    monkeypatch.setattr(torch, "save", lambda *args: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    store.save([copy(BLOCK, 1)])
    assert not store.entries and not list(tmp_path.glob("*.pt*"))


def test_prefix_digests_cover_whole_blocks_only():
    ids = list(range(2 * BLOCK + 3))
    digests = prefix_digests(ids)
    assert len(digests) == 2 and digests[0] == prefix_digests(ids[:BLOCK])[0]
    assert prefix_digests(ids[:BLOCK] + [0] * BLOCK)[1] != digests[1]
    assert MIN_TOKENS <= BLOCK  # a saved copy is always worth taking


def test_a_read_only_folder_raises_nothing(tmp_path, monkeypatch):
    store = SavedPrefixes(tmp_path)
    store.save([copy(BLOCK, 1)])
    refuse = lambda *args, **kwargs: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
    for name in ("unlink", "replace", "write_text", "mkdir"):
        monkeypatch.setattr(type(tmp_path), name, refuse)
    store.save([copy(BLOCK, 2)])
    store.forget(copy(BLOCK, 1).ids)
    trim(tmp_path, max_bytes=0)
    assert taken(store, copy(BLOCK, 1).ids, cached=0) is None  # forgotten, though its file stays


def test_an_index_naming_files_outside_its_folder_is_not_trusted(tmp_path):
    """A crafted index ("../" in a digest) would have its copies dropped, that is deleted, outside
    the folder; it is read as no index at all."""
    victim = tmp_path / "victim.pt"
    victim.write_bytes(b"a file of the user's")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "index.json").write_text('{"entries": [{"digests": ["../victim"], "tokens": 1000000000}]}')
    store = SavedPrefixes(folder)
    assert store.entries == {}
    store.save([])
    store.forget(CHAT)
    assert victim.read_bytes() == b"a file of the user's"


def test_saved_copies_are_private(tmp_path):
    saved_run("float", tmp_path / "caches")
    for path in (tmp_path / "caches").rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path
