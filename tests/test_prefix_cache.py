"""A request keeps what the models' caches hold from the previous one that its prompt begins
with (the conversation so far, a regenerated answer's prompt), or what a kept copy of an earlier
conversation holds, and reads only the rest: the same tokens as reading the whole prompt again."""
import threading
import time

import pytest
import torch

from app.bench.speed import long_prompt_runs
from app.engine.measuring import engine_run
from app.engine.models.decoder import cached
from app.engine.engine import SpeculativeEngine
from app.engine.kv.kept_prefixes import MIN_TOKENS, RESERVE_BYTES, PrefixStore, Snapshot, keep_prefix
from app.engine.proposers import DraftModelProposer
from app.engine.sampling import SamplingParams
from tests.helpers import all_steps, options
from tests.tiny import tiny_model, tiny_sliding_model, wide_low_bit

PROMPT = list(range(1, 20))


@pytest.fixture(scope="module", params=["low-bit", "float"])
def engine(request):
    """Low-bit models run the C++ layer stack (batch-invariant: the cached keys are the very ones
    a fresh prefill computes); float ones run transformers' forward."""
    if request.param == "low-bit":
        return SpeculativeEngine(wide_low_bit(5, 8), wide_low_bit(5, 4))  # the same model in 4 bits: drafts agree
    return SpeculativeEngine(tiny_model(seed=1), tiny_model(seed=1, init_range=0.21))


def answered(engine: SpeculativeEngine, prompt: list[int], **overrides) -> tuple[list[int], int]:
    """The answer's ids and how many prompt tokens the target found in its cache."""
    steps = all_steps(engine, prompt, **{"k": 4, "max_new_tokens": 24, **overrides})
    return [token.id for step in steps for token in step.tokens], steps[-1].stats.cached_prompt_tokens


def read_afresh(engine: SpeculativeEngine, prompt: list[int], **overrides) -> list[int]:
    engine.forget()
    ids, cached = answered(engine, prompt, **overrides)
    assert cached == 0
    return ids


def test_a_follow_up_reads_only_what_its_prompt_adds(engine):
    engine.forget()
    answer, cached = answered(engine, PROMPT)
    assert cached == 0
    follow_up = PROMPT + answer + [7, 8, 9]
    ids, cached = answered(engine, follow_up)
    # The cache holds the prompt and the answer but its last token (no step fed that one)
    assert cached == len(PROMPT) + len(answer) - 1
    assert ids == read_afresh(engine, follow_up) == read_afresh(engine, follow_up, speculative=False)


def test_a_regenerated_prompt_is_read_once(engine):
    engine.forget()
    first, _ = answered(engine, PROMPT)
    again, cached = answered(engine, PROMPT)
    assert cached == len(PROMPT) - 1  # the last prompt token goes in with the first step
    assert again == first


def test_a_different_prompt_keeps_only_the_shared_beginning(engine):
    engine.forget()
    answered(engine, PROMPT)
    other = PROMPT[:5] + [40, 41, 42, 43]
    ids, cached = answered(engine, other)
    assert cached == 5
    assert ids == read_afresh(engine, other)


def test_a_stopped_answer_leaves_a_cache_the_next_request_can_use(engine):
    engine.forget()
    cancel = threading.Event()
    for _ in engine.generate(PROMPT, options(k=4, max_new_tokens=40), cancel):
        cancel.set()  # the user pressed Stop after the first step
    follow_up = PROMPT + [30, 31]
    ids, cached = answered(engine, follow_up)
    assert cached == len(PROMPT)
    assert ids == read_afresh(engine, follow_up)


def test_going_back_to_an_earlier_chat_reads_only_what_it_adds(engine):
    """A question in another chat replaces the live caches; the first chat's were kept aside."""
    engine.forget()
    first_chat = [(7 * i) % 90 + 1 for i in range(MIN_TOKENS + 10)]
    answer, _ = answered(engine, first_chat)
    answered(engine, PROMPT)  # the other chat
    follow_up = first_chat + answer + [7, 8, 9]
    ids, cached = answered(engine, follow_up)
    assert cached == len(first_chat) + len(answer) - 1
    assert engine._draft.length >= len(first_chat)  # the draft got its copy back too
    assert ids == read_afresh(engine, follow_up) == read_afresh(engine, follow_up, speculative=False)


def test_a_message_read_ahead_is_answered_as_if_read_afresh(engine):
    """The message being typed is read before it is sent: its request finds all of it but the
    last token cached, and answers as if it had read the whole prompt itself."""
    prompt = list(range(1, 80))  # more than two passes of a read-ahead
    expected = read_afresh(engine, prompt)
    engine.forget()
    assert engine.read_ahead(prompt, threading.Event()) == len(prompt) - 1
    assert engine._draft.length == len(prompt) - 1  # the draft too: it need not catch up first
    ids, cached = answered(engine, prompt)
    assert cached == len(prompt) - 1 and ids == expected


def test_typing_on_reads_only_what_changed_and_a_cancelled_read_ahead_stops(engine):
    engine.forget()
    typed = list(range(1, 40))
    assert engine.read_ahead(typed, threading.Event()) == len(typed) - 1
    retyped = typed[:-3] + list(range(50, 90))  # the last words changed, and more typed
    stopped = threading.Event()
    stopped.set()
    assert engine.read_ahead(retyped, stopped) == len(typed) - 3  # what still holds is kept, nothing read
    assert engine.read_ahead(retyped, threading.Event()) == len(retyped) - 1
    ids, cached = answered(engine, retyped)
    assert cached == len(retyped) - 1 and ids == read_afresh(engine, retyped)


def test_bench_speed_times_a_prompt_read_ahead_from_its_sending(engine, monkeypatch):
    """bench speed's long prompt, also read ahead as the window reads a message being typed: the
    timed run finds it cached, answers as the others do, and its clock starts at the sending."""
    reading = engine.read_ahead
    monkeypatch.setattr(engine, "read_ahead", lambda *args: time.sleep(1.0) or reading(*args))  # a slow reading
    prompt = list(range(1, 80))
    runs = {"plain": engine_run(engine, options(speculative=False, k=4)), "speculative": engine_run(engine, options(k=4)),
            "speculative_read_ahead": engine_run(engine, options(k=4), read_ahead=True)}
    record = long_prompt_runs(runs, prompt, 16)
    assert record["identical"] and record["speculative_read_ahead"]["seconds"] < 1.0
    assert runs["speculative_read_ahead"](prompt, 16).stats.cached_prompt_tokens == len(prompt) - 1
    assert runs["speculative"](prompt, 16).stats.cached_prompt_tokens == 0


def test_nothing_is_read_ahead_while_an_answer_runs_or_past_the_context(engine):
    engine.forget()
    steps = engine.generate(PROMPT, options(k=4, max_new_tokens=8))
    next(steps)  # the answer holds the engine
    assert engine.read_ahead(list(range(30, 60)), threading.Event()) == 0
    answer = [token.id for step in steps for token in step.tokens]
    assert answer  # it went on undisturbed
    held = list(engine._target.ids)
    assert engine.read_ahead([1] * engine.target.context_length, threading.Event()) == 0
    assert engine._target.ids == held


def test_forgetting_drops_the_kept_copies(engine):
    engine.forget()
    first_chat = list(range(1, MIN_TOKENS + 11))
    answered(engine, first_chat)
    answered(engine, PROMPT)
    live = lambda: engine._target.cache_bytes + engine._draft.cache_bytes
    kept = engine._target.prefixes.snapshots[0]
    assert kept.nbytes == sum(t.nbytes for t in torch.utils._pytree.tree_leaves(kept.state)) > 0
    assert engine.cache_bytes() == live() + kept.nbytes + engine._draft.prefixes.nbytes  # what the window shows
    engine.forget()
    assert engine.cache_bytes() == live()
    assert answered(engine, first_chat + [5])[1] == 0


@pytest.mark.parametrize("kind", ["low-bit", "float"])
def test_a_restored_cache_is_the_one_that_was_kept(kind):
    """Restoring a copy of the first 80 of 100 tokens (the store's limit) leaves the cache a
    fresh read of those 80 gives: the same logits for what follows."""
    model = cached(wide_low_bit(5, 8).model if kind == "low-bit" else tiny_model(seed=3).model)
    model.prefixes = PrefixStore(max_tokens=80)
    conversation = [(5 * i) % 90 + 1 for i in range(100)]
    model.feed(torch.tensor(conversation))
    assert keep_prefix(model, PROMPT) == 1  # PROMPT shares one token with it: the rest kept aside
    model.feed(torch.tensor(PROMPT[1:]))
    assert keep_prefix(model, conversation) == 80
    restored = model.forward(torch.tensor(conversation[80:90]), keep=10)
    model.reset()
    model.feed(torch.tensor(conversation[:80]))
    assert torch.equal(restored, model.forward(torch.tensor(conversation[80:90]), keep=10))


def test_the_store_keeps_recent_copies_within_its_limit():
    store = PrefixStore(max_tokens=300)
    store.keep(Snapshot(list(range(100)), None))
    store.keep(Snapshot(list(range(150)), None))  # contains the first: it goes
    assert [len(s.ids) for s in store.snapshots] == [150]
    store.keep(Snapshot([9] * 100, None))
    store.keep(Snapshot([8] * 100, None))  # over the limit: the oldest goes
    assert [s.ids[0] for s in store.snapshots] == [9, 8]
    assert store.take([9] * 50 + [1], cached=0) is None  # shares fewer than MIN_TOKENS more than the live cache
    assert store.take([9] * 90 + [1], cached=0).ids == [9] * 100
    assert [s.ids[0] for s in store.snapshots] == [8]  # taken out: the live cache holds it now


def test_copies_never_take_the_machines_last_free_memory():
    """The machine's free memory as the copies leave it: 250 MB above the reserve without them."""
    mb = 1 << 20
    store = PrefixStore(max_tokens=10_000, available=lambda: RESERVE_BYTES + 250 * mb - store.nbytes)
    for token in (1, 2):
        store.keep(Snapshot([token] * 100, None, nbytes=100 * mb))
    assert [s.ids[0] for s in store.snapshots] == [1, 2]
    store.keep(Snapshot([3] * 100, None, nbytes=100 * mb))  # 50 MB short: the oldest goes
    assert [s.ids[0] for s in store.snapshots] == [2, 3]
    store.keep(Snapshot([4] * 100, None, nbytes=400 * mb))  # never fits: it goes too, last
    assert store.snapshots == []


def test_the_draft_keeps_its_cache_too():
    """The draft model's cache is kept the same way: it drafts exactly what a draft that read
    the whole prompt drafts, after reading only what is new."""
    draft = wide_low_bit(6, 4)
    proposer = DraftModelProposer(cached(draft.model), SamplingParams(), None)
    assert proposer.begin(PROMPT) == 0
    proposer.propose(3)
    proposer.commit(2, 50)  # two drafts accepted, then the target's token
    follow_up = PROMPT + proposer.ids[len(PROMPT):] + [60, 61]
    assert proposer.begin(follow_up) == len(PROMPT) + 2  # the prompt and the two accepted drafts
    fresh = DraftModelProposer(cached(draft.model), SamplingParams(), None)
    fresh.begin(follow_up)
    assert proposer.propose(4).tokens.tolist() == fresh.propose(4).tokens.tolist()


def test_sliding_window_models_read_every_prompt_whole():
    """transformers cannot crop a sliding-window cache far back: such a model keeps nothing."""
    engine = SpeculativeEngine(tiny_sliding_model(seed=1), tiny_sliding_model(seed=2))
    first, _ = answered(engine, PROMPT)
    again, cached = answered(engine, PROMPT)
    assert cached == 0 and again == first
    # so reading a message ahead would be wasted: it is not read
    held = list(engine._target.ids)
    assert engine.read_ahead(PROMPT + [5, 6], threading.Event()) == 0 and engine._target.ids == held
