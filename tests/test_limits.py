"""Layer 4: seeded determinism, cancellation, stop tokens, max length, context overflow."""
import threading

import pytest

from app.engine.engine import GenerationOptions, SpeculativeEngine
from app.engine.errors import PromptTooLongError
from app.engine.sampling import SamplingParams
from app.engine.steps import Source
from tests.helpers import all_steps, generated_ids
from tests.tiny import tiny_model

PROMPT = [1, 2, 3, 4, 5]
HOT = SamplingParams(temperature=1.0, top_p=0.95)


def test_same_seed_same_sample_other_seed_other_sample(tiny_target, tiny_draft):
    engine = SpeculativeEngine(tiny_target, tiny_draft)
    first = generated_ids(engine, PROMPT, sampling=HOT, seed=5, max_new_tokens=40)
    again = generated_ids(engine, PROMPT, sampling=HOT, seed=5, max_new_tokens=40)
    other = generated_ids(engine, PROMPT, sampling=HOT, seed=6, max_new_tokens=40)
    assert first == again
    assert first != other


def test_cancel_stops_at_next_step(tiny_target, tiny_draft):
    engine = SpeculativeEngine(tiny_target, tiny_draft)
    cancel = threading.Event()
    steps = []
    for step in engine.generate(PROMPT, GenerationOptions(k=3, adaptive=False, max_new_tokens=100), cancel):
        steps.append(step)
        if len(steps) == 2:
            cancel.set()
    assert len(steps) == 3
    assert steps[-1].finish == "cancelled" and steps[-1].tokens == []
    assert steps[-1].stats.target_passes == 2


def test_cancel_from_another_thread(tiny_target, tiny_draft):
    engine = SpeculativeEngine(tiny_target, tiny_draft)
    cancel = threading.Event()
    first_step = threading.Event()
    result = []

    def worker():
        for step in engine.generate(PROMPT, GenerationOptions(max_new_tokens=10_000), cancel):
            first_step.set()
            result.append(step)

    thread = threading.Thread(target=worker)
    thread.start()
    assert first_step.wait(30)
    cancel.set()
    thread.join(30)
    assert not thread.is_alive()
    assert result[-1].finish == "cancelled"
    assert sum(len(s.tokens) for s in result) < 10_000


def test_stop_token_inside_an_accepted_run():
    target = tiny_model(seed=1)
    plain = generated_ids(SpeculativeEngine(target), PROMPT, speculative=False, max_new_tokens=30)
    # a token first seen at position >= 3, so with k=8 it falls inside an accepted run
    position = next(i for i in range(3, 30) if plain[i] not in plain[:i])
    target.model.generation_config.eos_token_id = plain[position]
    engine = SpeculativeEngine(target, tiny_model(seed=1))  # same weights: all accepted
    steps = all_steps(engine, PROMPT, k=8, max_new_tokens=30)
    ids = [t.id for s in steps for t in s.tokens]
    assert ids == plain[: position + 1]
    assert steps[-1].finish == "stop"
    assert steps[-1].tokens[-1].source is Source.ACCEPTED


@pytest.mark.parametrize("max_new", [1, 5, 10, 13])
def test_max_new_tokens_reached_inside_a_step(tiny_target, max_new):
    engine = SpeculativeEngine(tiny_target, tiny_target)
    plain = generated_ids(engine, PROMPT, speculative=False, max_new_tokens=40)
    steps = all_steps(engine, PROMPT, k=8, max_new_tokens=max_new)
    assert [t.id for s in steps for t in s.tokens] == plain[:max_new]
    assert steps[-1].finish == "length"


def test_prompt_longer_than_context_is_refused_clearly():
    engine = SpeculativeEngine(tiny_model(seed=1, context=32))
    with pytest.raises(PromptTooLongError, match="40 tokens but the model's context holds 32"):
        all_steps(engine, list(range(40)), speculative=False)


def test_generation_stops_at_the_context_edge():
    small = tiny_model(seed=1, context=32)
    engine = SpeculativeEngine(small, tiny_model(seed=1, context=32))
    steps = all_steps(engine, list(range(28)), k=8, max_new_tokens=100)
    assert sum(len(s.tokens) for s in steps) == 4
    assert steps[-1].finish == "context"


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="k must be"):
        GenerationOptions(k=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_a_second_concurrent_request_is_refused(tiny_target):
    from app.engine.errors import EngineBusyError

    engine = SpeculativeEngine(tiny_target)
    first = engine.generate(PROMPT, GenerationOptions(speculative=False, max_new_tokens=20))
    next(first)
    with pytest.raises(EngineBusyError):
        next(engine.generate(PROMPT, GenerationOptions(speculative=False, max_new_tokens=5)))
    list(first)  # the first request finishes normally and frees the engine
    assert len(list(engine.generate(PROMPT, GenerationOptions(speculative=False, max_new_tokens=5)))) > 0


@pytest.mark.parametrize("speculative", [False, True])
def test_a_long_prompt_is_read_in_chunks_that_report_progress_and_can_be_stopped(monkeypatch, speculative):
    """Reading a prompt PROMPT_CHUNK tokens at a time announces each chunk after the first with a
    step without tokens, changes no output (the low-bit target is batch invariant), and Stop
    between chunks ends the request before its first token, keeping what was read."""
    from app.engine import loop
    from tests.tiny import wide_low_bit

    target, draft = wide_low_bit(seed=3, bits=4), wide_low_bit(seed=4, bits=4)
    prompt = [(7 * i) % 90 + 1 for i in range(40)]
    options = dict(speculative=speculative, max_new_tokens=12)
    whole = generated_ids(SpeculativeEngine(target, draft), prompt, **options)
    monkeypatch.setattr(loop, "PROMPT_CHUNK", 8)
    engine = SpeculativeEngine(target, draft)
    steps = all_steps(engine, prompt, **options)
    progress = [step.stats.prompt_read for step in steps if not step.tokens and step.finish is None]
    assert progress == [8, 16, 24, 32]  # 39 tokens before the last, which goes with the first step
    assert [t.id for step in steps for t in step.tokens] == whole
    cancel = threading.Event()
    engine.forget()
    stopped = []
    for step in engine.generate(prompt, GenerationOptions(**options), cancel):
        stopped.append(step)
        cancel.set()
    assert [s.stats.prompt_read for s in stopped] == [8, 0] and stopped[-1].finish == "cancelled"
    assert all(not s.tokens for s in stopped) and engine._target.length == 8
