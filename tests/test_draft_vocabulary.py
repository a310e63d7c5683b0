"""The draft's reduced vocabulary: a cheaper output layer that never changes what is emitted."""
import random

import pytest
import torch

from app.engine.draft_vocabulary import BLOCK, DraftVocabulary
from app.engine.engine import GenerationOptions, SpeculativeEngine
from app.engine.models.lean_decoder import LeanDecoder
from app.engine.lowbit.modules import quantize_model
from app.engine.models.loading import LoadedModel
from app.engine.sampling import SamplingParams, logits_to_probs
from app.engine.steps import Source
from tests.helpers import all_steps, generated_ids
from tests.tiny import tiny_model

VOCAB = 200  # not a multiple of the 32-id blocks: the last block holds ids past the vocabulary
COMMON = 64  # the first two blocks


def low_bit(seed: int, vocab: int = VOCAB, bits: int = 4) -> LoadedModel:
    model = tiny_model(seed=seed, vocab_size=vocab)
    return LoadedModel(f"tiny-{seed}-q{bits}", quantize_model(model.model, bits), model.tokenizer)


@pytest.fixture(scope="module")
def model():
    return low_bit(21)


def test_logits_over_the_vocabulary_are_the_output_layers_own(model):
    decoder = LeanDecoder(model.model, VOCAB)
    vocabulary = DraftVocabulary.for_draft(decoder, VOCAB, COMMON)
    prompt = [5, 150, 199]  # blocks 0 (common), 4 and 6 (the last, partly past the vocabulary)
    vocabulary.reset(prompt)
    full = decoder.forward(torch.tensor(prompt), keep=1)[0]
    decoder.reset()
    logits = decoder.forward(torch.tensor(prompt), keep=1, vocabulary=vocabulary)[0]

    real = logits.isfinite()
    expected_ids = [*range(COMMON), *range(4 * BLOCK, 5 * BLOCK), *range(6 * BLOCK, VOCAB)]
    assert vocabulary.ids[real].tolist() == expected_ids
    assert int((~real).sum()) == 7 * BLOCK - VOCAB  # the padding, never drafted
    assert torch.equal(logits[real], full[expected_ids])  # the same arithmetic, column by column
    # and back: each id's column (the repeat penalty finds recent tokens so); none for ids outside
    assert vocabulary.columns_of(torch.tensor(expected_ids)).tolist() == real.nonzero().squeeze(1).tolist()
    # 100 lies in block 3, not drafted; 199 is 7 into block 6, the subset's fourth; 131 3 into block 4, its third
    assert vocabulary.columns_of(torch.tensor([100, 199, 131])).tolist() == [3 * BLOCK + 7, 2 * BLOCK + 3]

    probs = vocabulary.spread(logits_to_probs(logits[None], SamplingParams()))[0]
    assert probs.shape == (VOCAB,)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[expected_ids] = False
    assert probs[outside].eq(0).all() and probs[~outside].gt(0).all()
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)


def test_a_full_sized_or_float_output_layer_gets_no_subset(model, tiny_target):
    assert DraftVocabulary.for_draft(LeanDecoder(model.model, VOCAB), VOCAB, VOCAB + BLOCK) is None
    assert DraftVocabulary.for_draft(LeanDecoder(model.model, VOCAB), VOCAB, 0) is None
    assert SpeculativeEngine(tiny_target, tiny_target, COMMON).draft_vocabulary is None  # fp32: transformers' forward


@pytest.mark.parametrize("k", [2, 5])
@pytest.mark.parametrize("repeat_penalty", [1.0, 1.3])
def test_greedy_output_is_the_targets_and_only_the_vocabulary_is_drafted(model, k, repeat_penalty):
    # The draft is the target itself, so every rejection comes from the vocabulary: a token
    # outside it cannot be drafted, the target corrects to it, and its block joins. With a repeat
    # penalty the draft must find the recent tokens among its columns to agree.
    engine = SpeculativeEngine(model, model, COMMON)
    prompt = [3, 1, 4, 1, 5, 90]
    sampling = SamplingParams(repeat_penalty=repeat_penalty)
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=60, sampling=sampling)
    steps = all_steps(engine, prompt, k=k, adaptive=False, max_new_tokens=60, sampling=sampling)
    assert [t.id for s in steps for t in s.tokens] == plain

    blocks = set(range(COMMON // BLOCK)) | {t // BLOCK for t in prompt}
    corrections = 0
    for token in (t for s in steps for t in s.tokens):
        in_vocabulary = token.id // BLOCK in blocks
        if token.source is Source.ACCEPTED:
            assert in_vocabulary
        if token.source is Source.CORRECTED:
            assert not in_vocabulary  # the draft is the target: nothing else is ever rejected
            corrections += 1
        blocks.add(token.id // BLOCK)
    assert corrections > 0  # the answer left the vocabulary it started with


def test_an_unrelated_draft_over_a_subset_gives_the_targets_output(model):
    engine = SpeculativeEngine(low_bit(22, bits=8), model, COMMON)
    prompt = [7, 130, 12]
    assert generated_ids(engine, prompt, k=3, max_new_tokens=40) == generated_ids(
        engine, prompt, speculative=False, max_new_tokens=40)


def test_sampled_output_keeps_the_targets_distribution_when_the_draft_sees_a_subset():
    # Vocabulary 64, drafting only the first 32 tokens: rejection sampling must bring in the
    # other half of the target's distribution through its residual.
    vocab, prompt, samples = 64, [1, 2, 3], 3000
    target, draft = low_bit(31, vocab, bits=8), low_bit(32, vocab)
    params = SamplingParams(temperature=1.5)  # flatter than greedy-peaked: every token gets some mass
    expected = logits_to_probs(LeanDecoder(target.model, vocab).forward(torch.tensor(prompt), keep=1)[0], params)
    assert expected[BLOCK:].sum() > 0.2

    engine = SpeculativeEngine(target, draft, BLOCK)
    counts = torch.zeros(vocab)
    drafted_outside = 0
    for seed in random.Random(0).sample(range(2**62), samples):
        options = GenerationOptions(k=1, adaptive=False, sampling=params, seed=seed, max_new_tokens=2)
        first = list(engine.generate(prompt, options))[0].tokens[0]
        counts[first.id] += 1
        drafted_outside += first.source is Source.ACCEPTED and first.id >= BLOCK
    assert drafted_outside == 0
    tv = 0.5 * (counts / samples - expected).abs().sum().item()
    noise = 0.5 * sum((2 * p * (1 - p) / (torch.pi * samples)) ** 0.5 for p in expected.tolist())
    assert tv < 2 * noise, f"TV {tv:.3f} vs noise {noise:.3f}"


def test_an_answer_that_leaves_the_subset_often_is_drafted_over_the_whole_vocabulary(model):
    decoder = LeanDecoder(model.model, VOCAB)
    vocabulary = DraftVocabulary.for_draft(decoder, VOCAB, COMMON)
    vocabulary.reset([5])
    vocabulary.answered([1, 2, 70, 3, 110])  # 2 of 5 outside the subset: not yet
    assert not vocabulary.whole and len(vocabulary.ids) == 4 * BLOCK
    vocabulary.answered([150])  # 3 of 6
    assert vocabulary.whole
    assert vocabulary.ids[:VOCAB].tolist() == list(range(VOCAB))
    hidden = decoder.hidden(torch.tensor([5, 150]), keep=1)
    logits = vocabulary.logits(hidden)[0]
    assert torch.equal(logits[:VOCAB], decoder.model.lm_head(hidden)[0, :VOCAB].float())
    assert logits[VOCAB:].eq(float("-inf")).all()  # the last block's padding

    vocabulary.reset([5])  # the next request starts where this one ended up
    assert vocabulary.whole
    vocabulary.answered([1, 2, 3] * 10 + [70, 110, 150])  # 3 outside, but 3 of 33
    vocabulary.reset([5])
    assert not vocabulary.whole and len(vocabulary.ids) == COMMON


def test_greedy_output_is_the_targets_when_the_draft_widens_to_the_whole_vocabulary(model):
    # The draft is the target, over one block at first: the answer soon leaves it, and from then
    # on tokens outside the first subset are drafted and accepted.
    engine = SpeculativeEngine(model, model, BLOCK)
    prompt = [3, 1, 4]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=60)
    steps = all_steps(engine, prompt, k=4, adaptive=False, max_new_tokens=60)
    assert [t.id for s in steps for t in s.tokens] == plain
    assert engine.draft_vocabulary.whole
    blocks = {0} | {t // BLOCK for t in prompt}
    accepted_outside = 0
    for token in (t for s in steps for t in s.tokens):
        accepted_outside += token.source is Source.ACCEPTED and token.id // BLOCK not in blocks
        blocks.add(token.id // BLOCK)
    assert accepted_outside > 0
