"""The nucleus filter, the draw and the repeat penalty: fast paths that must give what the plain definitions give."""
import pytest
import torch

from app.engine.sampling import SamplingParams, argmax, draw, logits_to_probs, penalize_repeats


def nucleus_by_sorting(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition: sort every token, keep each while the mass before it is below top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    sorted_logits = sorted_logits.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= top_p, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits).softmax(-1)


@pytest.mark.parametrize("spread", [8.0, 3.0, 2.0, 0.5])  # nuclei of 1-56, 130-241, 968-1,142, 1,325-4,230 tokens
@pytest.mark.parametrize("top_p", [0.5, 0.95])
def test_the_nucleus_is_the_one_sorting_finds(spread, top_p):
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(1)) * spread
    params = SamplingParams(temperature=0.8, top_p=top_p)
    probs = logits_to_probs(logits, params)
    expected = nucleus_by_sorting(logits / 0.8, top_p)
    assert torch.equal(probs > 0, expected > 0)
    assert torch.allclose(probs, expected, atol=1e-7)


def test_draws_follow_the_distribution_and_never_take_an_impossible_token():
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.0, 0.0, 6.0, 0.0])  # unnormalised, zeros at both ends
    generator = torch.Generator().manual_seed(0)
    n = 20_000
    ids = draw(weights.expand(n, -1), generator)
    counts = torch.bincount(ids, minlength=len(weights)).float()
    assert counts[weights == 0].sum() == 0
    expected = weights / weights.sum() * n
    # binomial standard deviations: sqrt(n p (1 - p)) at most 70 here; allow four of them
    assert (counts - expected).abs().max() < 4 * 70
    assert draw(weights, torch.Generator().manual_seed(5)).shape == ()



def test_min_p_keeps_the_tokens_at_least_that_fraction_as_likely_as_the_likeliest():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.1, 0.09, 0.11]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, min_p=0.2))  # floor: 0.1
    assert torch.allclose(probs, torch.tensor([0.5, 0.2, 0.1, 0.0, 0.11]) / 0.91)


def test_the_filters_apply_in_order_temperature_top_k_top_p_min_p():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]))
    # top-k 4 drops 0.05; top-p 0.8 of the rest (0.4, 0.3, 0.15, 0.1 over 0.95) keeps three; min-p 0.4
    # then drops 0.15, less than 0.4 times the likeliest's 0.4
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=4, top_p=0.8, min_p=0.4))
    assert torch.allclose(probs, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0, 0.0]))


def test_argmax_is_torchs_first_largest_on_rows_and_vectors():
    values = torch.randn(6, 151936, generator=torch.Generator().manual_seed(0))
    values[1, 70000] = values[1, 9] = values[1].max() + 1  # a tie: the first index wins
    values[2, 5] = float("nan")  # torch takes a NaN for the largest value
    assert torch.equal(argmax(values), values.argmax(-1))
    assert argmax(values)[1] == 9
    assert argmax(values[3]).shape == () and argmax(values[3]) == values[3].argmax()
    assert torch.equal(argmax(values[:, ::2]), values[:, ::2].argmax(-1))  # not contiguous
    half = values.half()  # not float32: torch's own
    assert torch.equal(argmax(half), half.argmax(-1))


def penalised_by_definition(logits: list[float], text: list[int], penalty: float, last_n: int) -> list[float]:
    """llama.cpp's repeat penalty on one row, written out."""
    recent = set(text[-last_n:])
    return [(x / penalty if x > 0 else x * penalty) if token in recent else x for token, x in enumerate(logits)]


def test_the_repeat_penalty_lowers_each_recent_token_once_in_every_row():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -0.2, 1.0]] * 3)
    params = SamplingParams(repeat_penalty=2.0, repeat_last_n=3)
    text, drafted = [0, 4, 1, 1], [5, 3]  # row i follows text + drafted[:i]
    out = penalize_repeats(logits, text, drafted, params)
    for row in range(3):
        expected = penalised_by_definition(logits[row].tolist(), text + drafted[:row], 2.0, 3)
        assert out[row].tolist() == pytest.approx(expected)
    assert out[0].tolist() == pytest.approx([2.0, -2.0, 0.5, 3.0, -0.4, 1.0])  # 4 and 1 (twice: once lowered)
    assert out[2].tolist() == pytest.approx([2.0, -2.0, 0.5, 1.5, -0.2, 0.5])  # 1, 5, 3: 4 has left the window
    assert logits[0, 1] == -1.0  # the caller's logits stay as they were
    assert penalize_repeats(logits, text, drafted, SamplingParams()) is logits  # off: nothing to do


def test_the_repeat_penalty_finds_tokens_by_column_over_part_of_the_vocabulary():
    columns = {7: 0, 2: 1, 9: 2, 4: 3}  # the column of each token id the logits hold
    logits = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    columns_of = lambda ids: torch.tensor([columns[i] for i in ids.tolist() if i in columns], dtype=torch.long)
    out = penalize_repeats(logits, [9, 2, 5], [], SamplingParams(repeat_penalty=1.25), columns_of)
    assert out[0].tolist() == pytest.approx([1.0, 0.8, -1.25, 1.0])
