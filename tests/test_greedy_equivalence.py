"""Layer 2: greedy speculative output equals target-only greedy, token for token."""
import threading

import pytest
import torch

from app.engine.engine import GenerationOptions, ProposerKind, SpeculativeEngine
from app.engine.policy import CostAwareK, CostModel, StepOutcome
from app.engine.sampling import SamplingParams
from app.engine.steps import FinishReason, Source
from tests.helpers import all_steps, generated_ids
from tests.tiny import tiny_model

PROMPTS = [[1, 2, 3, 4, 5], [7], [10, 11, 12, 10, 11, 12, 10, 11]]
N_NEW = 48


def hf_greedy(loaded, prompt, n_new):
    out = loaded.model.generate(torch.tensor([prompt]), max_new_tokens=n_new, do_sample=False, min_new_tokens=n_new)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_plain_decoding_equals_transformers_greedy(tiny_target, prompt):
    engine = SpeculativeEngine(tiny_target)
    assert generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW) == hf_greedy(tiny_target, prompt, N_NEW)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_same_model_draft_accepts_everything(tiny_target, prompt, k):
    engine = SpeculativeEngine(tiny_target, tiny_target)
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW)
    steps = all_steps(engine, prompt, k=k, max_new_tokens=N_NEW)
    assert [t.id for s in steps for t in s.tokens] == plain
    stats = steps[-1].stats
    assert stats.acceptance_rate == 1.0
    # the first pass emits the prompt's token, plain; every later one k accepted + 1 bonus
    assert stats.target_passes == 1 + -(-(N_NEW - 1) // (k + 1))
    assert [t.source for t in steps[0].tokens] == [Source.PLAIN]
    assert {t.source for s in steps[1:-1] for t in s.tokens} == {Source.ACCEPTED, Source.BONUS}
    # (the last pass drafts only what the budget leaves room for: none for a single token)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_unrelated_draft_gives_target_output(tiny_target, tiny_draft, prompt, k):
    engine = SpeculativeEngine(tiny_target, tiny_draft)
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW)
    steps = all_steps(engine, prompt, k=k, max_new_tokens=N_NEW)
    assert [t.id for s in steps for t in s.tokens] == plain
    assert steps[-1].stats.acceptance_rate < 0.3
    corrected = [t for s in steps for t in s.tokens if t.source is Source.CORRECTED]
    assert corrected and all(t.replaced is not None and t.replaced != t.id for t in corrected)


@pytest.mark.parametrize("draft_name", ["same", "unrelated"])
def test_adaptive_k_gives_target_output(tiny_target, tiny_draft, draft_name):
    engine = SpeculativeEngine(tiny_target, tiny_target if draft_name == "same" else tiny_draft)
    for prompt in PROMPTS:
        plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW)
        assert generated_ids(engine, prompt, k=2, adaptive=True, max_new_tokens=N_NEW) == plain


PENALTY = SamplingParams(repeat_penalty=1.5, repeat_last_n=8)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_plain_decoding_with_a_repeat_penalty_over_everything_equals_transformers(tiny_target, prompt):
    # transformers' repetition penalty looks at the whole text: a window longer than it is the same
    whole = SamplingParams(repeat_penalty=1.5, repeat_last_n=len(prompt) + N_NEW)
    expected = tiny_target.model.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                                          do_sample=False, repetition_penalty=1.5)[0, len(prompt):].tolist()
    assert expected != hf_greedy(tiny_target, prompt, N_NEW)  # the penalty matters here
    engine = SpeculativeEngine(tiny_target)
    assert generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW, sampling=whole) == expected


@pytest.mark.parametrize("draft_name", ["same", "unrelated"])
def test_speculative_output_with_a_repeat_penalty_is_the_targets(tiny_target, tiny_draft, draft_name):
    engine = SpeculativeEngine(tiny_target, tiny_target if draft_name == "same" else tiny_draft)
    for prompt in PROMPTS:
        plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW, sampling=PENALTY)
        assert plain != generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW)
        steps = all_steps(engine, prompt, k=4, max_new_tokens=N_NEW, sampling=PENALTY)
        assert [t.id for s in steps for t in s.tokens] == plain
        if draft_name == "same":  # the draft penalises its tokens as the target's rows do
            assert steps[-1].stats.acceptance_rate == 1.0


def costs(verify_ms: dict[int, float], draft_ms: float) -> CostModel:
    return CostModel(draft_token=draft_ms / 1000, verify={n: ms / 1000 for n, ms in verify_ms.items()})


CHEAP_VERIFY = {1: 50, 9: 60, 17: 80}  # a memory-bound target: 9 tokens cost 1.2x one


def drafted(policy, confidences) -> int:
    """How many tokens the policy lets a draft of these confidences run to (as the proposer asks it)."""
    seen = []
    for confidence in confidences[: policy.k]:
        seen.append(confidence)
        if not policy.keep_drafting(seen):
            break
    return len(seen)


def test_cost_aware_policy_drafts_long_when_the_draft_is_sure_and_verification_is_cheap():
    policy = CostAwareK(costs(CHEAP_VERIFY, draft_ms=5))
    for _ in range(10):
        policy.observe(StepOutcome(drafted=8, accepted=8, draft_seconds=0.04, target_seconds=0.06))
    assert policy.k >= 8 and drafted(policy, [0.99] * 16) >= 8


def test_cost_aware_policy_stops_at_the_drafts_first_doubtful_token():
    policy = CostAwareK(costs(CHEAP_VERIFY, draft_ms=5))
    assert drafted(policy, [0.99, 0.98, 0.3, 0.99, 0.99]) == 3  # the 0.3 is offered, nothing after it
    assert drafted(policy, [0.99, 0.98, 0.97, 0.99, 0.99]) == 5


def test_cost_aware_policy_drafts_less_where_verifying_a_token_more_costs_more():
    sure = [0.95] * 16
    cheap = CostAwareK(costs(CHEAP_VERIFY, draft_ms=5))
    dear = CostAwareK(costs({1: 50, 17: 290}, draft_ms=5))  # 15 ms a verified token more
    assert drafted(dear, sure) < drafted(cheap, sure)
    slow_draft = CostAwareK(costs(CHEAP_VERIFY, draft_ms=20))
    assert drafted(slow_draft, sure) < drafted(cheap, sure)


def test_cost_aware_policy_falls_back_to_plain_steps_and_probes():
    policy = CostAwareK(costs({1: 50, 9: 110, 17: 180}, draft_ms=15))
    for _ in range(5):  # the draft keeps missing its first token
        policy.observe(StepOutcome(drafted=2, accepted=0, draft_seconds=0.03, target_seconds=0.06))
    assert policy.k == 0
    for _ in range(policy.probe_every):
        policy.observe(StepOutcome(drafted=0, accepted=0, target_seconds=0.05))
    assert policy.k > 0  # a probe after a run of plain steps


def test_cost_aware_policy_learns_from_what_was_offered():
    """A draft that stopped itself on low confidence and was fully accepted is no rejection."""
    stopped_itself = CostAwareK(costs(CHEAP_VERIFY, draft_ms=5))
    rejected = CostAwareK(costs(CHEAP_VERIFY, draft_ms=5))
    for _ in range(5):
        stopped_itself.observe(StepOutcome(drafted=2, accepted=2, draft_seconds=0.01, target_seconds=0.052))
        rejected.observe(StepOutcome(drafted=3, accepted=2, draft_seconds=0.015, target_seconds=0.053))
    assert stopped_itself.acceptance > rejected.acceptance


def test_cost_model_interpolates_between_measured_passes():
    model = costs({1: 50, 9: 90}, draft_ms=5)
    assert model.verify_seconds(5) == pytest.approx(0.070)
    assert model.verify_seconds(17) == pytest.approx(0.130)  # extrapolated along the last segment


def test_cost_model_prices_passes_by_context_length():
    """Passes measured at a long context scale the short-context curve near their size there; a
    context with none measured (or shorter) keeps the short curve, a longer one the longest below."""
    model = costs({1: 50, 9: 90, 17: 130}, draft_ms=5)
    model.observe(0, 0.0, 1, 0.055, context=600)  # bucket 512..1023: a plain pass 1.1x
    model.observe(0, 0.0, 9, 0.117, context=700)  # a pass over 9 tokens 1.3x
    assert model.context == 700 and set(model.verify_at) == {1}
    assert model.verify_seconds(1) == pytest.approx(0.055)
    assert model.verify_seconds(9) == pytest.approx(0.117) and model.verify_seconds(17) == pytest.approx(0.130 * 1.3)
    assert model.verify_seconds(3) == pytest.approx(0.060 * 1.1)  # nearer 1 than 9: scaled as 1 was
    model.context = 3000
    assert model.verify_seconds(9) == pytest.approx(0.117)
    model.context = 100
    assert model.verify_seconds(9) == pytest.approx(0.090) and model.verify == {1: 0.050, 9: 0.090, 17: 0.130}


def cheap_drafting(engine: SpeculativeEngine) -> SpeculativeEngine:
    """Frozen costs of a memory-bound target and a cheap draft (tiny models time differently)."""
    engine.costs = CostModel(draft_token=0.001, verify={n: 0.05 + 0.001 * n for n in range(1, 18)}, smoothing=0.0)
    return engine


def test_adaptive_k_grows_after_full_acceptance():
    confident = tiny_model(seed=1, init_range=2.0)  # peaked distributions: the draft is sure
    engine = cheap_drafting(SpeculativeEngine(confident, confident))
    steps = all_steps(engine, PROMPTS[0], k=1, adaptive=True, max_new_tokens=64)
    lengths = steps[-1].stats.accepted_lengths
    assert max(lengths) > 1  # started at k=1, so k must have grown


def test_unsure_draft_stops_early():
    """A same-model draft is always accepted, so only its low confidence shortens drafts."""
    engine = cheap_drafting(SpeculativeEngine(tiny_model(seed=1), tiny_model(seed=1)))
    steps = list(engine.generate(PROMPTS[0], GenerationOptions(k=8, adaptive=True, max_new_tokens=40, lookup=0)))
    assert steps[-1].stats.acceptance_rate == 1.0
    assert steps[-1].stats.drafted < 8 * steps[-1].stats.target_passes


@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompt_lookup_gives_target_output(tiny_target, prompt):
    engine = SpeculativeEngine(tiny_target)
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW)
    steps = all_steps(engine, prompt, proposer=ProposerKind.PROMPT_LOOKUP, k=4, max_new_tokens=N_NEW)
    assert [t.id for s in steps for t in s.tokens] == plain
    assert steps[-1].stats.drafted > 0


def test_prompt_lookup_accepts_repeated_text(tiny_target):
    """Random models fall into loops; lookup should then draft them correctly."""
    engine = SpeculativeEngine(tiny_target)
    steps = all_steps(engine, PROMPTS[0], proposer=ProposerKind.PROMPT_LOOKUP, k=4, max_new_tokens=96)
    assert steps[-1].stats.accepted > 0


def test_speculation_off_gives_only_plain_tokens(tiny_target, tiny_draft):
    engine = SpeculativeEngine(tiny_target, tiny_draft)
    steps = all_steps(engine, PROMPTS[0], speculative=False, max_new_tokens=20)
    assert {t.source for s in steps for t in s.tokens} == {Source.PLAIN}
    assert steps[-1].stats.drafted == 0 and steps[-1].stats.target_passes == 20


def test_sliding_window_models_generate_past_their_window():
    """Mistral-style sliding attention: rollback past the window needs the cache to record the
    past (transformers raises otherwise). Output equals plain decoding and transformers' own
    greedy generate, 60 tokens with a window of 16."""
    from tests.tiny import tiny_sliding_model

    target = tiny_sliding_model(seed=1)
    engine = SpeculativeEngine(target, tiny_sliding_model(seed=2))
    prompt = [1, 2, 3, 4]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=60)
    assert generated_ids(engine, prompt, k=4, max_new_tokens=60) == plain
    reference = target.model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False, min_new_tokens=60)
    assert reference[0, len(prompt):].tolist() == plain


def test_the_drafts_catch_up_on_the_prompt_is_not_a_cost_per_drafted_token(tiny_target):
    """The first draft feeds the whole prompt to the draft model; that time is reported apart,
    so the cost-aware policy does not take it for the price of each drafted token."""
    from app.engine.models.decoder import cached
    from app.engine.proposers import DraftModelProposer
    from app.engine.sampling import SamplingParams

    proposer = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None)
    proposer.begin(list(range(1, 60)))
    first = proposer.propose(3)
    assert first.catch_up_seconds > 0 and proposer.model.length == 59 + 2  # prompt + all drafts but the last
    assert first.catch_up_tokens == 58  # the last prompt token came with the first draft step
    proposer.commit(1, 7)
    assert proposer.behind() == 0
    assert proposer.propose(3).catch_up_seconds == 0.0  # only the target's token was new


def test_a_draft_ends_with_the_first_stop_token_it_drafts(tiny_target):
    """Nothing after the answer's end is ever emitted, so drafting on past it is wasted work."""
    from app.engine.models.decoder import cached
    from app.engine.proposers import DraftModelProposer
    from app.engine.sampling import SamplingParams

    prompt = list(range(1, 30))
    unstopped = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None)
    unstopped.begin(prompt)
    drafted = unstopped.propose(6).tokens.tolist()
    stop = drafted[2]
    stopping = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None, stop_tokens=frozenset({stop}))
    stopping.begin(prompt)
    assert stopping.propose(6).tokens.tolist() == drafted[: drafted.index(stop) + 1]


def test_after_a_fully_accepted_draft_the_draft_model_makes_one_pass_per_drafted_token(tiny_target):
    """The last draft token and the target's bonus token go into the draft model in one pass with
    the next draft step (a pass of its own for the last draft token cost as much as a drafted
    token); the drafts are the same as from a model fed everything afresh."""
    from app.engine.models.decoder import cached
    from app.engine.proposers import DraftModelProposer
    from app.engine.sampling import SamplingParams

    proposer = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None)
    proposer.begin(list(range(1, 30)))
    drafted = proposer.propose(3).tokens.tolist()
    proposer.commit(3, 7)  # all three accepted, then the bonus token
    assert proposer.behind() == 0
    passes = []
    forward = proposer.model.forward
    proposer.model.forward = lambda ids, keep: passes.append(ids.numel()) or forward(ids, keep)
    second = proposer.propose(3).tokens.tolist()
    assert passes == [2, 1, 1]  # the last draft token with the bonus token, then one per token
    fresh = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None)
    fresh.begin(list(range(1, 30)) + drafted + [7])
    assert fresh.propose(3).tokens.tolist() == second


def with_catch_up(catch_up_ms: float) -> CostModel:
    model = costs(CHEAP_VERIFY, draft_ms=5)
    model.catch_up_token = catch_up_ms / 1000
    return model


def test_cost_aware_policy_weighs_the_drafts_catch_up_against_the_tokens_left():
    policy = CostAwareK(with_catch_up(2.0))
    assert policy.k > 0
    assert policy.next_k(remaining=512, catch_up=100) == policy.k  # 0.2 s of catch-up, a long answer
    assert policy.next_k(remaining=64, catch_up=900) == 0  # 1.8 s of catch-up for 64 tokens: plain is faster
    assert policy.next_k(remaining=64, catch_up=0) == policy.k  # nothing to catch up on


def test_a_long_catch_up_waits_for_the_answer_to_prove_long():
    """The catch-up is priced over the tokens still to come as far as the answer shows: its length
    so far (at least the latest answers' length, 128 before any), within the budget left, not the
    whole budget."""
    policy = CostAwareK(with_catch_up(2.0))
    assert policy.next_k(remaining=511, catch_up=2800, generated=1) == 0  # 5.6 s against about 128 tokens
    assert policy.next_k(remaining=1000, catch_up=2800, generated=600) == policy.k  # a long answer earns it
    assert policy.next_k(remaining=100, catch_up=2800, generated=600) == 0  # but not with 100 tokens left
    assert policy.next_k(remaining=511, catch_up=150, generated=1) == policy.k  # a chat prompt: 0.3 s


def test_after_short_answers_a_catch_up_waits_for_the_answer_to_prove_long():
    policy = CostAwareK(with_catch_up(2.0))
    assert policy.next_k(remaining=511, catch_up=60, generated=1) == policy.k  # 0.12 s against about 128 tokens
    for _ in range(3):
        policy.costs.observe_answer(5)  # "Canberra."
    assert policy.next_k(remaining=511, catch_up=60, generated=1) == 0  # against about 5 tokens
    assert policy.next_k(remaining=511, catch_up=60, generated=40) == policy.k  # this one is longer
    policy.costs.observe_answer(300)
    assert policy.costs.typical_answer == pytest.approx(310 / 3)  # the latest three
    assert policy.next_k(remaining=511, catch_up=60, generated=1) == policy.k


def test_an_answer_stopped_by_the_user_says_nothing_of_the_next_ones_length(tiny_target, tiny_draft):
    engine = SpeculativeEngine(tiny_target, tiny_draft)
    cancel = threading.Event()
    for step in engine.generate([1, 2, 3], GenerationOptions(max_new_tokens=40), cancel):
        cancel.set()
    assert step.finish is FinishReason.CANCELLED and not engine.costs.answers
    steps = all_steps(engine, [1, 2, 3], max_new_tokens=12)
    assert list(engine.costs.answers) == [len([t for s in steps for t in s.tokens])] == [12]


def test_a_probe_is_not_worth_a_long_catch_up():
    policy = CostAwareK(costs({1: 50, 9: 110, 17: 180}, draft_ms=15))
    policy.costs.catch_up_token = 0.002
    for _ in range(5):
        policy.observe(StepOutcome(drafted=2, accepted=0, draft_seconds=0.03, target_seconds=0.06))
    for _ in range(policy.probe_every):
        policy.observe(StepOutcome(drafted=0, accepted=0, target_seconds=0.05))
    assert policy.k > 0  # it wants to probe
    assert policy.next_k(remaining=400, catch_up=policy.probe_every) == policy.k  # 16 ms after a run of plain steps
    assert policy.next_k(remaining=400, catch_up=100, generated=400) == policy.k  # 0.2 s of 20 s to come: worth a look
    assert policy.next_k(remaining=400, catch_up=600) == 0  # 1.2 s just to look


def test_a_long_prompt_with_a_short_answer_is_decoded_plainly(tiny_target, tiny_draft):
    """When the draft's catch-up on the prompt costs more than drafting can save over the
    answer, the draft is never fed the prompt and every step is a plain one."""
    engine = cheap_drafting(SpeculativeEngine(tiny_target, tiny_draft))
    engine.costs.catch_up_token = 0.01  # 10 ms per prompt token for the draft
    prompt = [(7 * i) % 90 + 1 for i in range(150)]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=8)
    steps = all_steps(engine, prompt, adaptive=True, max_new_tokens=8)
    assert [t.id for s in steps for t in s.tokens] == plain
    assert steps[-1].stats.drafted == 0 and engine._draft.length == 0
    # the same prompt with a long answer ahead is worth the catch-up (with no short answers
    # before it, which would make it wait for the answer to prove long)
    engine.costs.answers.clear()
    assert all_steps(engine, prompt, adaptive=True, max_new_tokens=100)[-1].stats.drafted > 0


def test_cost_aware_policy_now_and_then_drafts_on_past_where_the_rule_stops():
    # Verification looks expensive beyond 2 tokens (an estimate that is never measured again
    # while drafts stop at one token); exploring measures it again.
    policy = CostAwareK(costs({1: 50, 2: 52, 3: 100, 17: 300}, draft_ms=10), explore_every=4)
    lengths = []
    for _ in range(12):
        lengths.append(drafted(policy, [0.99] * 16))
        policy.observe(StepOutcome(drafted=lengths[-1], accepted=lengths[-1], draft_seconds=0.01 * lengths[-1],
                      target_seconds=policy.costs.verify_seconds(lengths[-1] + 1)))
    assert lengths.count(1) == 9 and all(n > 1 for n in lengths[3::4])  # steps 4, 8 and 12 go on


def test_one_slow_pass_barely_moves_the_cost_model_but_a_lasting_slowdown_does():
    model = costs({1: 40, 3: 45}, draft_ms=10)
    model.observe(2, 0.02, 3, 0.450)  # one pass ten times slower than usual
    assert model.verify[3] < 1.1 * 0.045 and model.draft_token == pytest.approx(0.010)
    for _ in range(12):
        model.observe(2, 0.04, 3, 0.090)  # everything now takes twice as long
    assert model.verify[3] > 1.8 * 0.045 and model.draft_token > 1.8 * 0.010
    model.observe(2, 0.02, 3, 0.045)  # faster passes count in full
    assert model.verify[3] < 0.9 * 0.090


def test_the_drafts_reading_of_the_prompt_counts_as_prefill_and_follows_the_first_token(tiny_target, tiny_draft):
    """As llama.cpp's speculative prefill includes its draft's reading of the prompt, so does
    ours, though the draft reads it only when it first drafts: at the second step, after the
    first token, which the target gives as soon as it has read the prompt."""
    import time

    engine = cheap_drafting(SpeculativeEngine(tiny_target, tiny_draft))
    forward = engine._draft.forward
    slow_reading = lambda ids, keep: (time.sleep(0.3) if ids.numel() > 8 else None) or forward(ids, keep)
    engine._draft.forward = slow_reading  # reading 78 prompt tokens takes 0.3 s; drafting is quick
    steps = list(engine.generate(list(range(1, 80)), GenerationOptions(k=2, adaptive=False, max_new_tokens=12)))
    first, second, last = steps[0].stats, steps[1].stats, steps[-1].stats
    assert first.prefill_seconds < 0.3 and [token.source for token in steps[0].tokens] == [Source.PLAIN]
    # the prompt's share of the draft's slow reading (78 of the 79 tokens it then reads) is prefill
    assert second.prefill_seconds - first.prefill_seconds >= 0.3 * 78 / 79 * 0.99
    assert second.draft_seconds < 0.3 and second.drafted == 2
    assert last.prefill_seconds == second.prefill_seconds  # the prompt is read once


def test_a_target_padded_past_its_drafts_vocabulary_pairs_with_it_and_keeps_its_output(tiny_draft):
    """A Qwen2.5 7B GGUF's tokenizer lists 128 placeholders ("[PAD151936]" ...) more than its
    0.5B draft's, for its larger embedding: the same tokens, so the pair is accepted and greedy
    speculation gives the target's output. Placeholders at other ids, or real tokens past the
    draft's, are still refused."""
    from app.engine.models.loading import LoadedModel, ModelError, vocabulary_mismatch
    from tests.tiny import tiny_tokenizer

    target = tiny_model(seed=1, vocab_size=104)
    padded = LoadedModel("tiny-padded", target.model, tiny_tokenizer(96, padding=8))
    engine = SpeculativeEngine(padded, tiny_draft)
    for prompt in PROMPTS:
        plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW)
        assert generated_ids(engine, prompt, k=4, max_new_tokens=N_NEW) == plain
        assert max(plain) < 96
    assert vocabulary_mismatch(tiny_draft.tokenizer, padded.tokenizer) is None
    misplaced = tiny_tokenizer(96)
    misplaced.add_tokens(["[PAD200]"])  # id 96: not a placeholder of its own row
    assert "96 tokens, the target's 97" in vocabulary_mismatch(tiny_draft.tokenizer, misplaced)
    with pytest.raises(ModelError, match="96 tokens, the target's 104"):
        SpeculativeEngine(target, tiny_draft)
