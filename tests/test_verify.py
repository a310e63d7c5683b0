"""Layer 1: the verifier on hand-built probabilities."""
import pytest
import torch

from app.engine.sampling import SamplingParams
from app.engine.verify import verify, verify_greedy, verify_sampled

V = 5


def one_hot_rows(*tokens: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


def test_greedy_perfect_match_gives_bonus():
    target = one_hot_rows(1, 2, 3, 4)  # [k+1, V]
    assert verify_greedy(torch.tensor([1, 2, 3]), target) == (3, 4)


def test_greedy_early_mismatch_returns_targets_token():
    target = one_hot_rows(1, 2, 3, 4)
    assert verify_greedy(torch.tensor([1, 0, 3]), target) == (1, 2)


def test_greedy_all_rejected():
    target = one_hot_rows(1, 2, 3, 4)
    assert verify_greedy(torch.tensor([0, 2, 3]), target) == (0, 1)


def test_empty_draft_is_one_target_token():
    assert verify_greedy(torch.empty(0, dtype=torch.long), one_hot_rows(3)) == (0, 3)


def test_sampled_accepts_when_target_is_at_least_draft():
    gen = torch.Generator().manual_seed(0)
    draft_probs = torch.full((2, V), 0.2)
    target_probs = torch.tensor([[0, 1.0, 0, 0, 0], [0, 0, 1.0, 0, 0], [0, 0, 0, 0, 1.0]])
    # p_target(x)/p_draft(x) = 5 for both drafts: always accepted, then the bonus from row 2.
    assert verify_sampled(torch.tensor([1, 2]), draft_probs, target_probs, gen) == (2, 4)


def test_sampled_rejects_impossible_token_and_samples_residual():
    gen = torch.Generator().manual_seed(0)
    draft_probs = torch.tensor([[0.5, 0.5, 0, 0, 0]])
    target_probs = torch.tensor([[0.5, 0, 0.5, 0, 0], [0.2] * V])
    # the draft's token 1 has p_target = 0: always rejected; residual max(0, p - q) = token 2 only.
    for _ in range(20):
        assert verify_sampled(torch.tensor([1]), draft_probs, target_probs, gen) == (0, 2)


def test_probs_none_accepts_while_draft_equals_targets_sample():
    gen = torch.Generator().manual_seed(0)
    target_probs = one_hot_rows(1, 2, 3, 4)  # deterministic samples 1, 2, 3, 4
    assert verify_sampled(torch.tensor([1, 2, 0]), None, target_probs, gen) == (2, 3)
    assert verify_sampled(torch.tensor([1, 2, 3]), None, target_probs, gen) == (3, 4)


def test_verify_dispatches_on_temperature():
    gen = torch.Generator().manual_seed(0)
    target_probs = torch.tensor([[0.1, 0.6, 0.1, 0.1, 0.1], [0.6, 0.1, 0.1, 0.1, 0.1]])
    assert verify(torch.tensor([1]), None, target_probs, SamplingParams(), gen) == (1, 0)


@pytest.mark.parametrize("rule", ["correct", "accept_if_target_higher"])
def test_first_token_distribution_matches_target(rule):
    """The emitted first token must follow p_target; a plausible wrong rule must fail."""
    gen = torch.Generator().manual_seed(1)
    target = torch.tensor([0.45, 0.05, 0.25, 0.15, 0.10])
    draft = torch.tensor([0.10, 0.40, 0.20, 0.10, 0.20])
    n = 20000
    drafts = torch.multinomial(draft, n, replacement=True, generator=gen)
    counts = torch.zeros(V)
    for x in drafts.tolist():
        if rule == "correct":
            n_acc, nxt = verify_sampled(torch.tensor([x]), draft[None], torch.stack([target, target]), gen)
        else:  # deterministic acceptance: keep x whenever the target likes it at least as much
            n_acc = int(target[x] >= draft[x])
            residual = (target - draft).clamp(min=0)
            nxt = int(torch.multinomial(residual / residual.sum(), 1, generator=gen))
        counts[x if n_acc else nxt] += 1
    tv = 0.5 * (counts / n - target).abs().sum().item()
    if rule == "correct":
        assert tv < 0.02
    else:
        assert tv > 0.05
