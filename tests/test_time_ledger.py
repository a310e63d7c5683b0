"""Speculation never slower than plain decoding: the time ledger's guarantee, on the tiny target
with a virtual clock (each target pass and each drafted token costs what a 2-core CPU's do), and a
proposer whose every token the target rejects."""
import pytest
import torch

from app.engine.choices import SamplingParams
from app.engine.loop import Limits, speculative_generate
from app.engine.models.decoder import cached
from app.engine.policy import CostAwareK, CostModel, FixedK, TimeLedger
from app.engine.proposers import Draft, NoProposer, _Committed
from tests.tiny import tiny_model

VERIFY_MS = {1: 29, 2: 31, 4: 36, 8: 51, 12: 77, 16: 103, 17: 108}  # one target pass over n tokens
DRAFT_MS = 6.5  # one drafted token
PROMPT = [5, 9, 2, 7, 3, 8, 1, 4]
TOKENS = 200
EPSILON = 0.01


class VirtualTime:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def verify_seconds(rows: int) -> float:
    points = sorted(VERIFY_MS)
    below = max(p for p in points if p <= rows)
    above = min((p for p in points if p >= rows), default=below)
    if above == below:
        return VERIFY_MS[below] / 1000
    return (VERIFY_MS[below] + (VERIFY_MS[above] - VERIFY_MS[below]) * (rows - below) / (above - below)) / 1000


class TimedTarget:
    """The tiny target's decoder, each forward pass costing the virtual clock what it would here."""

    def __init__(self, decoder, time: VirtualTime) -> None:
        self.decoder, self.time = decoder, time

    def __getattr__(self, name):
        return getattr(self.decoder, name)

    def forward(self, tokens, keep):
        self.time.seconds += verify_seconds(len(tokens))
        return self.decoder.forward(tokens, keep)


class AlwaysWrong(_Committed):
    """Drafts, at a draft model's cost, tokens the target never chooses (none of its own output)."""

    def __init__(self, never: int, time: VirtualTime) -> None:
        self.never, self.time = never, time

    def propose(self, k, keep_drafting=None, limit=None, use_copies=None) -> Draft:
        n = min(k, limit if limit is not None else k)
        self.time.seconds += n * DRAFT_MS / 1000
        self.last_draft = [self.never] * n
        return Draft(torch.tensor(self.last_draft, dtype=torch.long), None)


class WrongCopies(_Committed):
    """Offers, where the policy drafts nothing, a 12-token copy of earlier text the target never
    continues with (a copy costs no draft pass: only the longer target pass)."""

    def __init__(self, never: int) -> None:
        self.never = never

    def propose(self, k, keep_drafting=None, limit=None, use_copies=None) -> Draft:
        offered = min(12, limit if limit is not None else 12)
        taken = offered if use_copies is None else use_copies(k, offered)
        self.last_draft = [self.never] * taken
        return Draft(torch.tensor(self.last_draft, dtype=torch.long), None, looked_up=taken,
                     copies=[self.never] * offered)


def run(proposer_for, policy, ledger) -> tuple[float, list[int], int]:
    time = VirtualTime()
    target = TimedTarget(cached(tiny_model(seed=1, context=512).model), time)
    steps = list(speculative_generate(target, proposer_for(time), policy, PROMPT, SamplingParams(),
                                      Limits(TOKENS, 512), ledger=ledger, clock=time))
    return time.seconds, [t.id for s in steps for t in s.tokens], steps[-1].stats.drafted


def costs() -> CostModel:
    """What calibration would have measured of these costs (they are learnt further as steps run)."""
    return CostModel(draft_token=DRAFT_MS / 1000, verify={n: verify_seconds(n) for n in VERIFY_MS})


def test_a_draft_that_is_never_right_costs_at_most_epsilon_and_one_plain_step():
    plain_seconds, plain_ids, _ = run(lambda time: NoProposer(), FixedK(1), None)
    never = next(token for token in range(96) if token not in plain_ids)
    model = costs()
    seconds, ids, drafted = run(lambda time: AlwaysWrong(never, time), CostAwareK(model), TimeLedger(model, EPSILON))
    assert ids == plain_ids and drafted > 0  # it did draft: it looked, and was always wrong
    assert seconds <= (1 + EPSILON) * plain_seconds + verify_seconds(1)
    # without the ledger the same policy pays more than that (its probes, its optimistic start)
    model = costs()
    unguarded, _, _ = run(lambda time: AlwaysWrong(never, time), CostAwareK(model), None)
    assert unguarded > (1 + EPSILON) * plain_seconds + verify_seconds(1)


class CopiesAlways(CostAwareK):
    """A policy that takes every copy whole, however often copies were wrong."""

    def use_copies(self, k: int, n_copies: int) -> int:
        return n_copies


def test_copies_that_are_never_right_cost_at_most_epsilon_and_one_plain_step():
    """Whatever the policy makes of copies, the ledger lets them spend no more than drafts."""
    plain_seconds, plain_ids, _ = run(lambda time: NoProposer(), FixedK(1), None)
    never = next(token for token in range(96) if token not in plain_ids)
    bound = (1 + EPSILON) * plain_seconds + verify_seconds(1)
    for policy in (CostAwareK, CopiesAlways):
        model = costs()
        seconds, ids, proposed = run(lambda time: WrongCopies(never), policy(model), TimeLedger(model, EPSILON))
        assert ids == plain_ids and proposed > 0
        assert seconds <= bound
    unguarded, _, _ = run(lambda time: WrongCopies(never), CopiesAlways(costs()), None)
    assert unguarded > bound


def test_the_ledger_lets_a_good_draft_run_at_length():
    """A draft the target agrees with earns the ledger's credit within a few steps: long drafts."""
    model = costs()
    ledger = TimeLedger(model, EPSILON)
    assert ledger.allow(16) < 16  # a fresh request: no more than one plain step at stake
    for _ in range(4):
        ledger.record(drafted=8, emitted=9, seconds=8 * DRAFT_MS / 1000 + verify_seconds(9))
    assert ledger.saved > 0 and ledger.allow(16) == 16
    assert ledger.allow(0) == 0


@pytest.mark.parametrize("seconds, allowed", [(0.2, False), (2.0, True)])
def test_a_lost_step_stops_drafting_until_the_time_spent_covers_a_probe(seconds, allowed):
    """37 ms lost; a 1-token probe may lose 8.5 ms more: allowed once 1% of the time spent covers
    what one plain step (29 ms) does not, after about 1.6 s of plain steps."""
    model = costs()
    ledger = TimeLedger(model, EPSILON)
    ledger.record(drafted=4, emitted=1, seconds=4 * DRAFT_MS / 1000 + verify_seconds(5))  # all rejected
    for _ in range(int(seconds / verify_seconds(1))):
        ledger.record(drafted=0, emitted=1, seconds=verify_seconds(1))
    assert (ledger.allow(2) > 0) == allowed


def losing_step() -> "StepOutcome":
    from app.engine.policy import StepOutcome

    return StepOutcome(drafted=2, accepted=0, draft_seconds=0.013, target_seconds=verify_seconds(3))


def plain_step() -> "StepOutcome":
    from app.engine.policy import StepOutcome

    return StepOutcome(drafted=0, accepted=0, target_seconds=verify_seconds(1))


def test_what_a_request_learnt_of_the_draft_the_next_one_starts_from():
    """The acceptance lives with the engine's cost model: a request after one whose drafts all
    failed starts with plain steps, not with the prior's long drafts."""
    model = costs()
    first = CostAwareK(model)
    assert first.k == first.k_max  # the prior: 0.75
    for _ in range(6):
        first.observe(losing_step())
    assert first.k == 0
    assert CostAwareK(model).k == 0  # the next request knows


def test_a_probe_that_fails_doubles_the_wait_for_the_next_and_drafting_comes_back_short():
    from app.engine.policy import StepOutcome

    policy = CostAwareK(costs())
    for _ in range(6):
        policy.observe(losing_step())
    waits = []
    for _ in range(3):
        plain = 0
        while policy.k == 0:
            policy.observe(plain_step())
            plain += 1
        waits.append(plain)
        policy.observe(losing_step())  # the probe fails too
    assert waits[1] >= 2 * waits[0] - 1 and waits[2] >= 2 * waits[1] - 1, waits
    while policy.k == 0:
        policy.observe(plain_step())
    for _ in range(8):  # now the draft is right: drafting comes back, short first, then at length
        policy.observe(StepOutcome(drafted=policy.k, accepted=policy.k, draft_seconds=0.0065 * policy.k,
                                   target_seconds=verify_seconds(policy.k + 1)))
        if policy.drafting:
            break
    assert policy.drafting and policy.k == policy.restart
    policy.observe(StepOutcome(drafted=4, accepted=4, draft_seconds=0.026, target_seconds=verify_seconds(5)))
    assert policy.k == policy.k_max and policy.probe_interval == policy.probe_every
