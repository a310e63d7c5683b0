"""Layer 3: sampled speculative output has the target's distribution (tiny vocabulary)."""
import random

import pytest
import torch

from app.engine import verify as verify_module
from app.engine.engine import GenerationOptions, SpeculativeEngine
from app.engine.sampling import SamplingParams
from tests.tiny import tiny_model
from tests.two_tokens import exact_two_token_distribution, noise as sampling_noise

ORIGINAL_VERIFY_SAMPLED = verify_module.verify_sampled
VOCAB = 6
PROMPT = [1, 2, 3]
# One token: with few tokens penalised by the prompt, a target row that missed the draft token
# before it (and so did not penalise it) moves the distribution far beyond the noise.
ONE_TOKEN = [0]
# Its last three tokens came before: the first step proposes what followed them, with no model.
REPEATING_PROMPT = [1, 2, 3, 1, 2, 3]
# Every drafted x repeats "2 5 x", seen before followed by x + 5: the draft model's first token
# is always followed by a looked-up one, which the target often rejects (a search picked the
# tokens for that, so a wrong probability for looked-up tokens shows).
REPEATS_AFTER_A_DRAFT = [token for x in range(VOCAB) for token in (2, 5, x, (x + 5) % VOCAB)] + [2, 5]
N_SAMPLES = 2500


def wrong_rule(draft_tokens, draft_probs, target_probs, generator):
    """A plausible bug: accept exactly when the target likes the token at least as much."""
    if draft_probs is None:
        return ORIGINAL_VERIFY_SAMPLED(draft_tokens, draft_probs, target_probs, generator)
    k = draft_tokens.shape[0]
    rows = torch.arange(k)
    keep = (target_probs[rows, draft_tokens] >= draft_probs[rows, draft_tokens]).int()
    n = int(keep.cumprod(0).sum())
    if n == k:
        return k, int(torch.multinomial(target_probs[k], 1, generator=generator))
    residual = (target_probs[n] - draft_probs[n]).clamp(min=0)
    return n, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(seed=11, vocab_size=VOCAB, hidden=16, layers=1, init_range=0.5)
    draft = tiny_model(seed=12, vocab_size=VOCAB, hidden=16, layers=1, init_range=0.5)
    return target, draft


NUCLEUS = {"top_p": 0.9}
ALL_FILTERS = {"top_k": 4, "top_p": 0.95, "min_p": 0.05}  # at temperature 1 here, each removes tokens the others keep
REPEATS = {"repeat_penalty": 1.8, "top_p": 0.95}  # the penalty before the filters, as the draft applies it too
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}


@pytest.mark.parametrize(("rule", "temperature", "adaptive", "prompt", "filters"), [
    ("correct", 0.7, False, PROMPT, NUCLEUS), ("correct", 1.0, False, PROMPT, NUCLEUS),
    ("correct", 0.7, True, PROMPT, NUCLEUS), ("wrong", 0.7, False, PROMPT, NUCLEUS),
    ("correct", 0.7, False, REPEATING_PROMPT, NUCLEUS), ("correct", 0.7, False, REPEATS_AFTER_A_DRAFT, NUCLEUS),
    ("correct", 1.0, False, PROMPT, ALL_FILTERS), ("correct", 1.0, False, ONE_TOKEN, REPEATS),
    ("correct", 0.7, False, REPEATS_AFTER_A_DRAFT, REPEATS),
])
def test_two_token_distribution(pair, temperature, rule, adaptive, prompt, filters, monkeypatch):
    if rule == "wrong":
        monkeypatch.setattr(verify_module, "verify_sampled", wrong_rule)
    target, draft = pair
    params = SamplingParams(temperature=temperature, **filters)
    expected = exact_two_token_distribution(target, params, prompt)
    for name in filters:  # every filter must matter, or the case proves nothing about it
        loosened = {**filters, name: OFF[name]}
        assert not torch.equal(expected, exact_two_token_distribution(target, SamplingParams(temperature, **loosened), prompt))
    engine = SpeculativeEngine(target, draft)
    counts, looked_up = torch.zeros(VOCAB, VOCAB), 0
    # Well-spread seeds: the first draws of generators seeded 0, 1, 2, ... are not independent
    # enough for this test (seeds 0..2499 gave a total variation twice the noise bound).
    seeds = random.Random(0).sample(range(2**62), N_SAMPLES)
    for seed in seeds:
        # Three new tokens so the first step drafts k=2 (the budget caps k); the first two are
        # counted. Adaptive: the draft may also stop itself after one unsure token.
        options = GenerationOptions(k=2, adaptive=adaptive, sampling=params, seed=seed, max_new_tokens=3)
        steps = list(engine.generate(prompt, options))
        t1, t2 = [t.id for step in steps for t in step.tokens][:2]
        counts[t1, t2] += 1
        looked_up += steps[-1].stats.looked_up
    tv = 0.5 * (counts / N_SAMPLES - expected).abs().sum().item()
    noise = sampling_noise(expected, N_SAMPLES)  # allow twice what sampling noise alone gives
    if prompt not in (PROMPT, ONE_TOKEN):
        assert looked_up > 0  # the lookup cases did look up
    elif not adaptive:
        assert looked_up == 0  # a fixed k copies only after 3 repeated tokens (an adaptive policy after 1)
    if rule == "correct":
        assert tv < 2 * noise, f"TV {tv:.3f} vs noise {noise:.3f}"
    else:
        assert tv > 2 * noise, f"the wrong rule went unnoticed: TV {tv:.3f} vs noise {noise:.3f}"
