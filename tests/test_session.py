"""The chat session without Qt: requests, streaming saves, compare, interruption; the answer
builder's provenance for tokens without text of their own; the model cache's stale loads."""
import itertools
import json
import threading
from dataclasses import replace

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from app.chat.answer import AnswerBuilder
from app.chat.session import ChatSession, RequestKind, options_of, settings_of
from app.chat.store import ChatStore
from app.engine.engine import GenerationOptions, SpeculativeEngine
from app.engine.model_pool import ModelPool
from app.engine.sampling import SamplingParams
from app.engine.steps import EmittedToken, FinishReason, Source, Stats, Step
from app.engine.api import LoadOptions
from tests.helpers import options
from tests.tiny import tiny_model


@pytest.fixture
def engine():
    return SpeculativeEngine(tiny_model(seed=1), tiny_model(seed=2))


def run(session, engine, request, stop_after=None):
    """Feed the request's real engine steps into the session, as the chat controller does."""
    cancel = threading.Event()
    for count, step in enumerate(engine.generate(request.prompt_ids, request.options, cancel), 1):
        session.add_step(step)
        if count == stop_after:
            return  # a kill: no finish() call
    return session.finish()


def test_an_answer_joins_the_chat_with_typed_stats(tmp_path, engine):
    store = ChatStore(tmp_path / "c.sqlite3")
    session = ChatSession(store)
    request = session.ask("t5 t6 t7", engine, options(k=3, max_new_tokens=20))
    assert request.kind is RequestKind.ANSWER and session.busy
    message = run(session, engine, request)
    assert not session.busy
    stats = message.stats
    assert stats.emitted == 20 and stats.finish is FinishReason.LENGTH
    assert 0 < stats.first_token_seconds <= stats.seconds
    assert stats.context_used == len(request.prompt_ids) + 20 and stats.context_length == 256
    assert len(stats.token_ids) == 20 and stats.drafted > 0
    saved = store.load_chat(session.conversation.id).messages
    assert [m.role for m in saved] == ["user", "assistant"] and saved[1].stats == stats


def test_a_streaming_answer_is_saved_as_it_grows_and_marked_interrupted(tmp_path, engine):
    ticks = itertools.count(step=0.6)  # each clock read moves 0.6 s: a save every other step
    store = ChatStore(tmp_path / "c.sqlite3")
    session = ChatSession(store, clock=lambda: next(ticks))
    request = session.ask("t1 t2", engine, options(k=2, max_new_tokens=60))
    run(session, engine, request, stop_after=6)  # the process dies here
    reopened = ChatStore(tmp_path / "c.sqlite3").load_chat(session.conversation.id).messages
    assert [m.role for m in reopened] == ["user", "assistant"]
    partial = reopened[-1]
    assert partial.stats.finish is FinishReason.INTERRUPTED and partial.tokens
    # at most the steps since the last save are lost
    assert len(partial.stats.token_ids) >= len(session.builder.decoder.ids) - 2 * 3


def test_finishing_a_saved_streaming_answer_updates_its_row(tmp_path, engine):
    ticks = itertools.count(step=0.6)
    store = ChatStore(tmp_path / "c.sqlite3")
    session = ChatSession(store, clock=lambda: next(ticks))
    message = run(session, engine, session.ask("t1", engine, options(k=2, max_new_tokens=30)))
    saved = store.load_chat(session.conversation.id).messages
    assert len(saved) == 2 and saved[-1].id == message.id
    assert saved[-1].stats.finish is FinishReason.LENGTH and saved[-1].content == message.content


def test_closing_mid_answer_keeps_it_as_interrupted(tmp_path, engine):
    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    run(session, engine, session.ask("t1", engine, options(max_new_tokens=50)), stop_after=3)
    session.interrupt()
    assert not session.busy
    saved = session.store.load_chat(session.conversation.id).messages
    assert saved[-1].stats.finish is FinishReason.INTERRUPTED and saved[-1].tokens


def test_compare_is_stored_with_the_answer_it_compared(tmp_path, engine):
    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    answer = run(session, engine, session.ask("t3 t4", engine, options(k=3, max_new_tokens=16)))
    request = session.compare(engine, options())
    assert request.kind is RequestKind.COMPARE and not request.options.speculative
    assert request.options.k == 3  # the answer's own options, not the ones passed in
    assert session.streaming_message() is None  # a comparison is not part of the chat
    compared = run(session, engine, request)
    assert compared is answer and len(session.conversation.messages) == 2
    assert answer.stats.comparison.identical and answer.stats.comparison.first_difference is None
    saved = session.store.load_chat(session.conversation.id).messages[-1]
    assert saved.stats.comparison == answer.stats.comparison


def test_a_second_request_while_one_runs_is_refused(tmp_path, engine):
    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    session.ask("t1", engine, options())
    with pytest.raises(RuntimeError, match="stop it first"):
        session.ask("t2", engine, options())


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte, as a byte-level BPE without merges: an 'é' is two tokens."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_a_corrected_token_without_text_keeps_its_provenance():
    tokenizer = byte_level_tokenizer()
    a, (e_first, e_second), z = tokenizer.encode("a"), tokenizer.encode("é"), tokenizer.encode("z")
    assert len(a) == 1 and len(z) == 1
    builder = AnswerBuilder(tokenizer, "speculative")
    stats = Stats()
    builder.add(Step([EmittedToken(a[0], Source.ACCEPTED, 0.9, 0.8),
                      EmittedToken(e_first, Source.CORRECTED, 0.6, 0.1, replaced=z[0])], [z[0]], stats))
    builder.add(Step([EmittedToken(e_second, Source.ACCEPTED, 0.9, 0.9)], [], stats))
    assert [(t.text, t.source) for t in builder.tokens] == [("a", "accepted"), ("é", "corrected")]
    assert builder.tokens[1].replaced == "z" and builder.message().content == "aé"


def test_streamed_pieces_join_to_the_full_decode():
    tokenizer = byte_level_tokenizer()
    text = "naïve café — 世界 🤖 ok"
    builder = AnswerBuilder(tokenizer, "plain")
    for token_id in tokenizer.encode(text):
        builder.add(Step([EmittedToken(token_id, Source.PLAIN, 0.5)], [], Stats()))
    assert "".join(t.text for t in builder.tokens) == text == builder.message().content


def test_a_superseded_load_returns_no_engine():
    loads = []

    def load(source, device, dtype, report, precision, held):
        loads.append(source)
        if source == "slow-target":
            newer.append(cache.request())  # the user picks other models while this one loads
        return tiny_model(seed=1)

    cache, newer = ModelPool(load), []
    old = cache.request()
    assert cache.engine(old, LoadOptions(target="slow-target"), lambda *_: None) is None
    assert loads == ["slow-target"]  # stopped before loading the draft
    assert cache.engine(newer[0], LoadOptions(target="slow-target"), lambda *_: None) is not None
    assert loads == ["slow-target", "default-draft"]  # the target was kept, not loaded twice


def test_a_pairs_second_model_is_checked_beside_the_first():
    """The memory check of the model loaded second counts what the first already takes."""
    loads = []

    def load(source, device, dtype, report, precision, held):
        loads.append((source, held))
        return tiny_model(seed=len(loads))

    cache = ModelPool(load)
    engine = cache.engine(cache.request(), LoadOptions(), lambda *_: None)
    assert loads == [("default-target", 0), ("default-draft", engine.target.memory_bytes)]


def test_the_system_prompt_comes_first(tmp_path, engine):
    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    session.new_chat(system_prompt="t42 t43")
    request = session.ask("t1", engine, options())
    text = engine.target.tokenizer.decode(request.prompt_ids)
    assert text.index("t42 t43") < text.index("t1")


def test_regenerate_and_edit_keep_the_store_consistent(tmp_path, engine):
    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    run(session, engine, session.ask("t1", engine, options(max_new_tokens=6)))
    run(session, engine, session.ask("t2", engine, options(max_new_tokens=6)))
    run(session, engine, session.regenerate(engine, options(max_new_tokens=9)))
    last = session.conversation.messages[-1]
    assert [v.stats.emitted for v in last.versions] == [6, 9] and last.shown == 1
    run(session, engine, session.compare(engine, options()))
    session.show_version(3, 0)
    session.show_version(3, 1)  # the comparison belongs to version 2 and stays with it
    reloaded = session.store.load_chat(session.conversation.id).messages[-1]
    assert last.stats.comparison is not None and reloaded.versions[1].stats.comparison == last.stats.comparison
    run(session, engine, session.edit(2, "t3", engine, options(max_new_tokens=5)))
    saved = session.store.load_chat(session.conversation.id).messages
    assert [(m.role, m.content) for m in saved] == [(m.role, m.content) for m in session.conversation.messages]
    assert [m.role for m in saved] == ["user", "assistant", "user", "assistant"] and saved[2].content == "t3"
    assert not saved[-1].versions


def test_compare_repeats_the_shown_versions_own_settings_also_after_a_reopen(tmp_path, engine):
    store = ChatStore(tmp_path / "c.sqlite3")
    session = ChatSession(store)
    run(session, engine, session.ask("t3 t4", engine, options(k=3, seed=5, max_new_tokens=12)))
    run(session, engine, session.regenerate(engine, options(k=6, seed=9, max_new_tokens=8)))
    session.show_version(1, 0)  # back to the first answer, made with other settings than the last request's
    made_with = lambda request: (request.options.k, request.options.seed, request.options.max_new_tokens,
                                 request.options.speculative)
    assert made_with(session.compare(engine, options(k=2, seed=1))) == (3, 5, 12, False)
    session.finish()  # nothing generated: the comparison is dropped

    reopened = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    reopened.open_chat(session.conversation.id)
    assert reopened.conversation.messages[1].shown == 0
    assert made_with(reopened.compare(engine, options(k=2, seed=1))) == (3, 5, 12, False)
    reopened.finish()
    reopened.show_version(1, 1)
    assert made_with(reopened.compare(engine, options(k=2, seed=1))) == (6, 9, 8, False)


def test_the_sampling_filters_are_saved_with_an_answer_and_older_answers_still_read():
    made = GenerationOptions(sampling=SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05,
                                                     repeat_penalty=1.2, repeat_last_n=32), seed=3)
    assert options_of(settings_of(made), GenerationOptions()).sampling == made.sampling
    older = json.loads(settings_of(made))
    for name in ("min_p", "repeat_penalty", "repeat_last_n"):  # saved before these existed: made without them
        del older[name]
    assert options_of(json.dumps(older), GenerationOptions()).sampling == SamplingParams(0.8, 40, 0.9, 0.0)


def test_continue_grows_an_answer_into_the_one_a_larger_budget_gives(tmp_path, engine):
    """Greedy: an answer cut by its budget, then continued, is token for token the answer one
    request with both budgets gives; it stays one message, saved, whose first token and prompt
    are its start's; the continuation reads only what the cache lacks."""
    for speculative in (True, False):
        whole = ChatSession(ChatStore(tmp_path / f"whole{speculative}.sqlite3"))
        expected = run(whole, engine, whole.ask("t3 t4", engine, options(k=3, speculative=speculative, max_new_tokens=30)))
        session = ChatSession(ChatStore(tmp_path / f"parts{speculative}.sqlite3"))
        start = run(session, engine, session.ask("t3 t4", engine, options(k=3, speculative=speculative, max_new_tokens=12)))
        first = start.stats
        assert first.finish is FinishReason.LENGTH and session.can_continue()
        request = session.continue_answer(engine, options(k=2, speculative=speculative, max_new_tokens=18))
        assert request.kind is RequestKind.CONTINUE and request.prompt_ids[-12:] == list(first.token_ids)
        steps = list(engine.generate(request.prompt_ids, request.options, threading.Event()))
        assert steps[-1].stats.cached_prompt_tokens >= len(request.prompt_ids) - 2
        for step in steps:
            session.add_step(step)
        grown = session.finish()
        assert grown is start and [m.role for m in session.conversation.messages] == ["user", "assistant"]
        assert grown.stats.token_ids == expected.stats.token_ids and grown.content == expected.content
        stats = grown.stats
        assert stats.emitted == 30 and stats.finish is FinishReason.LENGTH and len(grown.tokens) == len(expected.tokens)
        assert (stats.first_token_seconds, stats.prompt_tokens, stats.cached_prompt_tokens) == \
            (first.first_token_seconds, first.prompt_tokens, first.cached_prompt_tokens)
        assert stats.seconds > first.seconds and stats.target_passes > first.target_passes
        assert stats.drafted >= first.drafted and len(stats.acceptance_trace) >= len(first.acceptance_trace)
        assert json.loads(stats.made_with)["max_new_tokens"] == 30  # Compare reruns it whole
        saved = session.store.load_chat(session.conversation.id).messages
        assert len(saved) == 2 and saved[-1].stats == stats and saved[-1].content == grown.content


def test_a_stopped_answer_continues_and_only_a_stopped_one(tmp_path, engine):
    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    whole = run(session, engine, session.ask("t1 t2", engine, options(k=2, max_new_tokens=40))).stats
    assert whole.finish is FinishReason.LENGTH
    cancel = threading.Event()
    request = session.regenerate(engine, options(k=2, max_new_tokens=40))
    for count, step in enumerate(engine.generate(request.prompt_ids, request.options, cancel), 1):
        session.add_step(step)
        if count == 3:
            cancel.set()  # Stop: the loop ends after this step
    stopped = session.finish()
    assert stopped.stats.finish is FinishReason.CANCELLED and len(stopped.versions) == 2
    assert session.can_continue()
    run(session, engine, session.continue_answer(engine, options(k=2, max_new_tokens=40 - stopped.stats.emitted)))
    last = session.conversation.messages[-1]
    assert last.stats.token_ids == whole.token_ids and last.shown == 1
    assert last.versions[1].stats == last.stats and last.versions[0].stats == whole  # the other version untouched
    last.stats = replace(whole, finish=FinishReason.STOP)
    assert not session.can_continue() and session.continue_answer(engine, options()) is None


def test_a_continuation_is_saved_as_it_grows(tmp_path, engine):
    ticks = itertools.count(step=0.6)
    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"), clock=lambda: next(ticks))
    start = run(session, engine, session.ask("t1", engine, options(k=2, max_new_tokens=8)))
    run(session, engine, session.continue_answer(engine, options(k=2, max_new_tokens=40)), stop_after=6)  # killed
    reopened = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    reopened.open_chat(session.conversation.id)
    messages = reopened.conversation.messages
    assert [m.role for m in messages] == ["user", "assistant"] and messages[-1].id == start.id
    assert messages[-1].stats.finish is FinishReason.INTERRUPTED and messages[-1].stats.emitted > 8
    assert messages[-1].stats.token_ids[:8] == start.stats.token_ids[:8] and reopened.can_continue()


def test_a_continuation_finishes_a_character_split_at_the_stop():
    tokenizer = byte_level_tokenizer()
    a, (e_first, e_second) = tokenizer.encode("a"), tokenizer.encode("é")
    builder = AnswerBuilder(tokenizer, "plain")
    builder.add(Step([EmittedToken(a[0], Source.PLAIN, 0.9), EmittedToken(e_first, Source.PLAIN, 0.6)], [], Stats(),
                     FinishReason.CANCELLED))
    stopped = builder.message()
    assert stopped.content == "a" and stopped.stats.token_ids == (a[0], e_first)
    more = AnswerBuilder(tokenizer, "plain", continues=stopped)
    more.add(Step([EmittedToken(e_second, Source.PLAIN, 0.9)], [], Stats(emitted=1), FinishReason.LENGTH))
    grown = more.message()
    assert grown.content == "aé" and [t.text for t in grown.tokens] == ["a", "é"]
    assert grown.stats.token_ids == (a[0], e_first, e_second) and grown.stats.finish is FinishReason.LENGTH


def test_a_prompt_switches_thinking_off_only_where_the_template_can():
    from app.chat.prompt import chat_prompt_ids, switches_thinking

    tokenizer = tiny_model(seed=1).tokenizer
    messages = [{"role": "user", "content": "t3"}]
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert not switches_thinking(tokenizer)
    assert chat_prompt_ids(tokenizer, messages, thinking=False) == chat_prompt_ids(tokenizer, messages)
    tokenizer.chat_template += "{% if enable_thinking is defined and enable_thinking is false %}t90{% endif %}"
    assert switches_thinking(tokenizer)
    off, on = chat_prompt_ids(tokenizer, messages, thinking=False), chat_prompt_ids(tokenizer, messages)
    assert off == on + tokenizer("t90", add_special_tokens=False).input_ids


def test_a_regenerated_answer_is_saved_as_it_grows(tmp_path, engine):
    """A kill while a regenerated answer streams keeps what it had a second before, as a new
    version beside the answer it regenerates."""
    ticks = itertools.count(step=0.6)
    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"), clock=lambda: next(ticks))
    first = run(session, engine, session.ask("t1", engine, options(k=2, max_new_tokens=8))).stats.token_ids
    sampled = replace(options(k=2, max_new_tokens=40), sampling=SamplingParams(temperature=1.0), seed=5)
    run(session, engine, session.regenerate(engine, sampled), stop_after=6)  # killed
    reopened = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    reopened.open_chat(session.conversation.id)
    last = reopened.conversation.messages[-1]
    assert len(last.versions) == 2 and last.shown == 1
    assert last.versions[0].stats.token_ids == first  # the answer it regenerates, untouched
    assert last.stats.finish is FinishReason.INTERRUPTED and last.stats.emitted > 0
    run(reopened, engine, reopened.regenerate(engine, sampled))  # a whole one adds one version more, not two
    assert len(reopened.conversation.messages[-1].versions) == 3


def test_compare_says_why_greedy_texts_may_differ_only_where_they_may(tmp_path, engine):
    """On the CPU greedy texts must agree, and Compare excuses nothing; on a GPU (its engine's
    rounding note) a difference is said to come from rounding, and the note is kept with the chat."""
    from app.engine.engine import GPU_ROUNDING
    from app.ui.message_html import comparison_html

    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    answer = run(session, engine, session.ask("t3 t4", engine, options(max_new_tokens=8)))
    run(session, engine, session.compare(engine, options()))
    assert engine.rounding_note is None and answer.stats.comparison.rounding_note is None
    on_cpu = replace(answer.stats.comparison, identical=False, first_difference=12)
    assert "(expected only when sampling with temperature &gt; 0)" in comparison_html(on_cpu)
    on_gpu = replace(on_cpu, rounding_note=GPU_ROUNDING)
    assert "greedy, on a GPU a pass over several tokens rounds otherwise" in comparison_html(on_gpu)
    answer.set_stats(replace(answer.stats, comparison=on_gpu))
    session.store.update_message(answer)
    assert session.store.load_chat(session.conversation.id).messages[-1].stats.comparison == on_gpu


def test_dropping_the_oldest_turns_keeps_the_system_prompt_and_the_question_and_leaves_the_answer_room(tmp_path, engine):
    from app.chat.prompt import chat_prompt_ids
    from app.chat.session import Overflow
    from app.engine.errors import PromptTooLongError

    session = ChatSession(ChatStore(tmp_path / "c.sqlite3"))
    session.set_system_prompt("t90 t91 t92")
    long_turn = " ".join(f"t{i % 80 + 3}" for i in range(70))
    for _ in range(2):
        run(session, engine, session.ask(long_turn, engine, options(k=3, max_new_tokens=20)))
    session.overflow = Overflow.STOP
    kept = session.ask(long_turn, engine, options(k=3, max_new_tokens=20))  # 3 x 70 + answers: over 256
    assert kept.left_out == 0 and len(kept.prompt_ids) > 256
    with pytest.raises(PromptTooLongError):
        run(session, engine, kept)
    session.finish()
    session.overflow = Overflow.DROP_OLDEST
    request = session.answer(engine, options(k=3, max_new_tokens=20))
    # the oldest questions went with their answers, a pair at a time, until the answer has its room
    assert request.left_out == 2  # the first question and its answer: the rest fits with 20 to spare
    assert len(request.prompt_ids) + 20 <= 256
    shown = session.conversation.prompt_messages()
    expected = chat_prompt_ids(engine.target.tokenizer, shown[:1] + shown[1 + request.left_out:], session.thinking)
    assert request.prompt_ids == expected and shown[0] == {"role": "system", "content": "t90 t91 t92"}
    message = run(session, engine, request)
    assert message.stats.emitted == 20  # the whole answer fitted
