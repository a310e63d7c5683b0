"""A draft model's draft extended by tokens looked up in earlier text: free drafts, same output."""
import pytest
import torch

from app.engine.models.decoder import cached
from app.engine.engine import SpeculativeEngine
from app.engine.loop import Limits, speculative_generate
from app.engine.policy import CostAwareK, CostModel, FixedK, StepOutcome, TimeLedger
from app.engine.proposers import DraftModelProposer, PromptLookupProposer, SuffixIndex, continuation
from app.engine.sampling import SamplingParams
from app.engine.steps import Source, Stats
from tests.helpers import all_steps, generated_ids

N_NEW = 48


def test_continuation_follows_the_latest_earlier_occurrence():
    ids = [5, 6, 7, 1, 2, 5, 6, 7, 8, 9, 5, 6, 7]
    assert continuation(ids, 3, max_ngram=3, min_ngram=3) == [8, 9, 5]  # not [1, 2, 5]
    assert continuation(ids, 9, max_ngram=3, min_ngram=3) == [8, 9, 5, 6, 7]  # up to the end
    assert continuation([5, 6, 7, 1, 2, 3], 3, max_ngram=3, min_ngram=3) == []
    assert continuation([5, 6, 7, 1, 2, 3, 7], 2, max_ngram=3, min_ngram=1) == [1, 2]


def longest_earlier_match(text: list[int], k: int, n: int = 3, longest: int = 64) -> tuple[list[int], int]:
    """By brute force: the longest copy (at most k tokens, at most as many as matched) that follows
    an earlier occurrence of text's end matching at least n tokens (then the longest match, then
    the latest), and how many tokens matched there (at most `longest`)."""
    best, best_start = (0, 0), -1
    for start in range(len(text) - n):
        matched = 0
        while matched < longest and start + n - 1 - matched >= 0 and \
                text[start + n - 1 - matched] == text[len(text) - 1 - matched]:
            matched += 1
        offered = (min(k, matched, len(text) - start - n), matched)
        if matched >= n and offered >= best:
            best, best_start = offered, start
    return (text[best_start + n : best_start + n + best[0]], best[1]) if best_start >= 0 else ([], 0)


def test_the_suffix_index_finds_the_longest_earlier_match():
    """The draft model's lookups go through an index of the committed text, extended as tokens
    are committed: the same matches as searching the whole text each time, with or without
    drafted tokens after it."""
    generator = torch.Generator().manual_seed(3)
    for _ in range(100):  # three token kinds: n-grams recur often, also across the tail's start
        ids = torch.randint(0, 3, (int(torch.randint(0, 60, (1,), generator=generator)),), generator=generator).tolist()
        index = SuffixIndex(3, longest=12)
        index.reset(ids[:5])
        index.extend(ids[5:40])
        index.extend(ids[40:])
        for cut in range(0, 6):
            tail = torch.randint(0, 3, (cut,), generator=generator).tolist()
            for k in (1, 3, 8):
                assert index.match(tail, k) == longest_earlier_match(ids + tail, k, longest=12)


def test_the_longest_match_wins_over_the_latest_one():
    """In a long text a common phrase recurs: the copy follows where the most tokens matched."""
    passage = [40, 41, 42, 43, 44, 5, 6, 7, 8, 9, 10, 11]
    text = passage + [50, 5, 6, 7, 60, 61] + [42, 43, 44, 5, 6, 7]
    index = SuffixIndex(3)
    index.reset(text)
    assert index.match([], 16) == ([8, 9, 10, 11, 50, 5], 6)  # as many as matched
    assert index.match([1, 2, 3], 4) == ([], 0)


def test_a_copy_is_as_long_as_its_match(tiny_target):
    """A long repeated passage is copied in steps longer than 3 tokens: a 3-token match gives 3,
    a longer one as many as matched, up to the lookup's limit."""
    passage = list(range(40, 70))
    proposer = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None, lookup_tokens=16)
    for seen, copy in ((3, passage[3:6]), (10, passage[10:20]), (20, passage[20:30] + [1, 2] + passage[:4])):
        proposer.begin(passage + [1, 2] + passage[:seen])
        draft = proposer.propose(0, limit=20)  # a plain step: the copy alone
        assert draft.tokens.tolist() == copy and draft.lead == draft.looked_up == len(copy)


def test_the_draft_model_drafts_on_where_a_copy_stops_within_the_step(tiny_target):
    """A step that begins with a copy goes on with the draft model's own tokens after it: those it
    drafts from the text with the copy, its probabilities theirs, the copy's certain."""
    passage = list(range(40, 70))
    prompt = passage + [1, 2] + passage[:3]
    proposer = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None, lookup_tokens=16)
    proposer.begin(prompt)
    draft = proposer.propose(4, limit=20)
    assert draft.lead == 3 and draft.own >= 1 and draft.tokens[:3].tolist() == passage[3:6]
    assert [draft.copied(i) for i in range(4)] == [True, True, True, False]
    assert draft.probs[torch.arange(3), draft.tokens[:3]].tolist() == [1.0, 1.0, 1.0]

    alone = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None)  # no copies
    alone.begin(prompt + passage[3:6])
    assert draft.tokens[3 : 3 + draft.own].tolist() == alone.propose(draft.own).tokens.tolist()


def test_drafting_on_after_a_copy_is_weighed_by_the_chance_that_the_whole_copy_is_accepted():
    costs = CostModel(draft_token=0.005, verify={1: 0.03, 2: 0.031, 8: 0.036, 16: 0.045})
    policy = CostAwareK(costs)
    for _ in range(30):
        costs.drafted.observe(4, rejected=True)
        costs.copied.of(4).observe(5, rejected=False)
    assert policy.keep_drafting([], 4)  # copies that are always right: the draft goes on after them
    for _ in range(30):
        costs.copied.of(4).observe(0, rejected=True)
    assert not policy.keep_drafting([], 4)  # copies rarely right: it would rarely be reached


def test_a_long_passage_is_copied_in_long_steps(tiny_target, monkeypatch):
    """The engine, adaptive or not, copies what the answer repeats in steps of more than 3
    tokens (a random tiny model's greedy answer falls into a loop: a passage repeated), and the
    answer is the plain one."""
    from app.engine import engine as engine_module

    # The time ledger's account is kept in the machine's seconds, which the frozen costs below do not
    # match: one slow pass (a busy machine) would close it. Its bound is test_time_ledger's.
    monkeypatch.setattr(engine_module, "TimeLedger", lambda costs: TimeLedger(costs, epsilon=1e9))
    engine = SpeculativeEngine(tiny_target, tiny_target)
    for first in range(30, 60):  # a prompt whose answer ends in a loop of at most 4 tokens
        plain = generated_ids(engine, [first, 31, 32], speculative=False, max_new_tokens=96)
        if any(plain[-24:-period] == plain[-24 + period :] for period in range(1, 5)):
            break
    else:
        pytest.fail("no answer of the tiny model loops")
    for adaptive in (False, True):
        # adaptive: the frozen costs of a memory-bound target and a dear draft (a tiny model's
        # timings are noise): copies are what pays
        engine.costs = CostModel(draft_token=0.03, verify={n: 0.05 + 0.001 * n for n in range(1, 18)}, smoothing=0.0)
        steps = all_steps(engine, [first, 31, 32], k=4, adaptive=adaptive, lookup=16, max_new_tokens=96)
        assert [t.id for s in steps for t in s.tokens] == plain
        copied_per_step = [sum(t.copied for t in s.tokens) for s in steps]
        assert max(copied_per_step) > 3, copied_per_step
        if not adaptive:  # where a copy stops, the draft model (the target itself here) drafts on in the same step
            assert any(before.copied and not after.copied and after.source == Source.ACCEPTED
                       for s in steps for before, after in zip(s.tokens, s.tokens[1:]))


def test_a_copy_alone_is_proposed_without_running_the_model(tiny_target):
    """In a plain step, where the copy fills the step, or where the policy does not draft on
    after it, a copy is the whole proposal: the draft model is neither run nor fed the prompt."""
    proposer = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None, lookup_tokens=3)
    proposer.begin([20, 21, 22, 23, 24, 25, 20, 21, 22])
    draft = proposer.propose(0, limit=6)
    assert draft.tokens.tolist() == [23, 24, 25] and draft.probs is None and draft.own == 0
    assert proposer.propose(4, limit=3).tokens.tolist() == [23, 24, 25]
    assert proposer.propose(4, lambda confidences, copied: False, limit=6).tokens.tolist() == [23, 24, 25]
    assert proposer.propose(4, limit=2).tokens.tolist() == [23, 24]  # the budget caps it
    assert proposer.model.length == 0


def test_a_looked_up_draft_ends_with_the_first_stop_token(tiny_target):
    """Earlier text that went on past an answer's end (a conversation's earlier turn) is copied
    up to that end only: nothing after a stop token is ever emitted."""
    prompt = [20, 21, 22, 23, 7, 25, 20, 21, 22]
    copying = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None, lookup_tokens=3)
    copying.begin(prompt)
    assert copying.propose(0, limit=4).tokens.tolist() == [23, 7, 25]
    stopping = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None, lookup_tokens=3,
                                  stop_tokens=frozenset({7}))
    stopping.begin(prompt)
    assert stopping.propose(4).tokens.tolist() == [23, 7]


def test_drafted_tokens_that_repeat_earlier_text_are_continued_from_it(tiny_target):
    """The draft model's token completes an n-gram seen before: what followed it there is
    appended, each with a distribution certain of it (so rejection sampling stays exact)."""
    model = cached(tiny_target.model)
    vocab = tiny_target.model.config.vocab_size
    for token in range(vocab):  # a prompt whose next greedy token is `token` and repeats "20 21 token"
        prompt = [20, 21, token, 50, 51, 20, 21]
        model.reset()
        if int(model.forward(torch.tensor(prompt), keep=1)[0].argmax()) == token:
            break
    else:
        pytest.fail("no prompt of this form continues the repeat")
    proposer = DraftModelProposer(model, SamplingParams(), None, lookup_tokens=3)
    proposer.begin(prompt)
    draft = proposer.propose(4, limit=8)
    assert draft.tokens.tolist() == [token, 50, 51, 20] and draft.own == 1
    assert proposer.model.length == len(prompt)  # one model pass: the drafted token is not fed yet
    certain = torch.zeros(3, draft.probs.shape[-1]).scatter_(1, torch.tensor([[50], [51], [20]]), 1.0)
    assert torch.equal(draft.probs[1:], certain)
    assert int(draft.probs[0].argmax()) == token and draft.probs[0].max() < 1


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("draft_name", ["same", "unrelated"])
def test_lookup_gives_target_output(tiny_target, tiny_draft, draft_name, k):
    engine = SpeculativeEngine(tiny_target, tiny_target if draft_name == "same" else tiny_draft)
    looked_up = 0
    for prompt in ([1, 2, 3, 4, 5], [10, 11, 12, 10, 11, 12, 10, 11], list(range(30, 60)) + list(range(30, 40))):
        plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW)
        for adaptive in (False, True):
            steps = all_steps(engine, prompt, k=k, adaptive=adaptive, lookup=3, max_new_tokens=N_NEW)
            assert [t.id for s in steps for t in s.tokens] == plain
            looked_up += steps[-1].stats.looked_up
    assert looked_up > 0


class RecordingK(FixedK):
    def observe(self, outcome):
        self.seen.append((outcome.drafted, outcome.accepted, outcome.verified))


def test_the_policy_learns_only_from_the_draft_models_tokens(tiny_target):
    """Looked-up tokens cost no model pass and say nothing about the draft model: the policy
    hears of the model's tokens (drafted, accepted) apart from the size of the target's pass."""
    policy = RecordingK(k=3)
    policy.seen = []
    proposer = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None, lookup_tokens=3)
    prompt = list(range(30, 60)) + list(range(30, 40))
    steps = list(speculative_generate(cached(tiny_target.model), proposer, policy, prompt, SamplingParams(),
                                      Limits(max_new_tokens=40, context_length=256)))
    before = Stats()
    for step, (n_drafted, n_accepted, n_verified) in zip(steps, policy.seen, strict=True):
        drafted, looked_up = step.stats.drafted - before.drafted, step.stats.looked_up - before.looked_up
        assert n_verified == drafted + 1 and n_drafted == drafted - looked_up
        assert n_accepted == min(step.stats.accepted - before.accepted, n_drafted)
        before = step.stats
    assert steps[-1].stats.looked_up > 0 and any(n for n, _, _ in policy.seen)


def test_a_prompt_lookup_proposers_tokens_are_its_own():
    """With prompt lookup as the proposer, its tokens are what the policy's k governs."""
    proposer = PromptLookupProposer()
    proposer.begin([5, 6, 7, 8, 5, 6])
    draft = proposer.propose(2)
    assert draft.tokens.tolist() == [7, 8] and draft.own == 2


def test_copied_tokens_are_marked_and_have_no_draft_probability(tiny_target):
    engine = SpeculativeEngine(tiny_target, tiny_target)
    prompt = list(range(30, 60)) + list(range(30, 40))
    tokens = [t for s in all_steps(engine, prompt, k=3, lookup=3, max_new_tokens=N_NEW) for t in s.tokens]
    copied = [t for t in tokens if t.copied]
    drafted = [t for t in tokens if t.source is Source.ACCEPTED and not t.copied]
    assert copied and drafted
    assert all(t.p_draft is None for t in copied if t.source is Source.ACCEPTED)
    assert all(t.p_draft is not None for t in drafted)


def test_a_copy_passed_over_leaves_the_drafting_to_the_model(tiny_target):
    """Where the policy declines a copy, the draft model drafts as if there were none, and the
    draft still tells which copy it passed over, for the policy to learn from."""
    prompt = [20, 21, 22, 23, 24, 25, 20, 21, 22]
    asked = []
    def declining(k, n_copies):
        asked.append((k, n_copies))
        return 0
    proposer = DraftModelProposer(cached(tiny_target.model), SamplingParams(), None, lookup_tokens=3)
    proposer.begin(prompt)
    draft = proposer.propose(4, limit=6, use_copies=declining)
    assert draft.own == 4 and draft.looked_up == 0 and draft.probs is not None
    assert (draft.copies, draft.copies_at) == ([23, 24, 25], 0) and asked[0] == (4, 3)
    plain_step = proposer.propose(0, limit=6, use_copies=declining)
    assert len(plain_step) == 0 and plain_step.copies == [23, 24, 25]
    taken = proposer.propose(4, limit=6, use_copies=lambda k, n: n)
    assert taken.tokens[:3].tolist() == [23, 24, 25] and taken.lead == 3 and taken.copies == [23, 24, 25]
    shortened = proposer.propose(0, limit=6, use_copies=lambda k, n: 2)
    assert shortened.tokens.tolist() == [23, 24] and shortened.copies == [23, 24, 25]


def test_a_copy_after_drafted_tokens_is_declined_mid_draft(tiny_target):
    model = cached(tiny_target.model)
    vocab = tiny_target.model.config.vocab_size
    for token in range(vocab):  # as in the test above: the drafted token completes a repeat
        prompt = [20, 21, token, 50, 51, 20, 21]
        model.reset()
        if int(model.forward(torch.tensor(prompt), keep=1)[0].argmax()) == token:
            break
    asked = []
    def declining(k, n_copies):
        asked.append(n_copies)
        return 0
    proposer = DraftModelProposer(model, SamplingParams(), None, lookup_tokens=3)
    proposer.begin(prompt)
    draft = proposer.propose(4, limit=8, use_copies=declining)
    assert draft.own == 4 and draft.looked_up == 0 and draft.tokens[0] == token and asked


def copy_policy() -> CostAwareK:
    # a memory-bound target (5 tokens cost 1.1x one), a draft token at a tenth of a pass
    return CostAwareK(CostModel(draft_token=0.005, verify={1: 0.050, 5: 0.055, 9: 0.060}))


def test_the_policy_learns_from_copies_whether_taken_or_passed_over():
    policy = copy_policy()
    start = policy.copied.of(3).rate
    policy.observe_copies([5, 6, 7], 0, [5, 6, 7, 8])  # all three accepted, then a bonus
    assert policy.copied.of(3).rate > start
    high = policy.copied.of(3).rate
    policy.observe_copies([5, 6, 7], 2, [1, 2, 5, 9])  # after two drafted tokens: one right, one wrong
    assert policy.copied.of(3).rate < high
    before = (policy.copied.of(3).accepted, policy.copied.of(3).rejected)
    policy.observe_copies([5, 6, 7], 3, [1, 2, 3])  # the step ended before the copy's place
    assert (policy.copied.of(3).accepted, policy.copied.of(3).rejected) == before
    policy.observe_copies([5, 6, 7], 0, [5, 6])  # its end unseen: two accepted, no rejection
    assert policy.copied.of(3).rejected < before[1]


def test_the_policy_copies_where_copies_pay():
    policy = copy_policy()
    for _ in range(20):  # a draft whose fourth token the target rejects: acceptance 0.75
        policy.observe(StepOutcome(drafted=4, accepted=3, draft_seconds=0.02, target_seconds=0.055))
    for _ in range(20):  # copies whose second token it rejects: less often right than the draft
        policy.observe_copies([5, 6, 7], 0, [5, 9, 7])
    assert policy.k > 0 and not policy.use_copies(policy.k, 3)
    assert policy.use_copies(0, 3)  # yet they beat a plain step
    for _ in range(20):  # copies it rejects at once
        policy.observe_copies([5, 6, 7], 0, [9, 6, 7])
    assert not policy.use_copies(0, 3)  # a longer pass for nothing
    for _ in range(20):  # copies it takes whole
        policy.observe_copies([5, 6, 7], 0, [5, 6, 7, 8])
    assert policy.use_copies(policy.k, 3) and policy.use_copies(0, 3)


def test_long_copies_are_learnt_apart_from_short_ones():
    """A long copy follows a long match: it may pay where short ones (common phrases) do not,
    and a plain step then takes it as far as it pays."""
    policy = copy_policy()
    for _ in range(20):
        policy.observe_copies([5, 6, 7], 0, [9, 6, 7])  # three-token copies: wrong at once
        policy.observe_copies(list(range(12)), 0, list(range(12)) + [99])  # twelve-token ones: right
    assert policy.use_copies(0, 3) == 0 and policy.use_copies(0, 12) == 12
    assert policy.copied.of(3) is not policy.copied.of(12) and policy.copied.of(12) is policy.copied.of(9)


def test_an_adaptive_engine_learns_copies_and_keeps_the_output(tiny_target):
    engine = SpeculativeEngine(tiny_target, tiny_target)
    prompt = list(range(30, 60)) + list(range(30, 40))
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=N_NEW)
    seen = []
    original = CostAwareK.observe_copies
    def recording(self, copies, at, emitted):
        seen.append(copies)
        original(self, copies, at, emitted)
    try:
        CostAwareK.observe_copies = recording
        steps = all_steps(engine, prompt, k=4, adaptive=True, lookup=3, max_new_tokens=N_NEW)
    finally:
        CostAwareK.observe_copies = original
    assert [t.id for s in steps for t in s.tokens] == plain
    assert any(seen)
