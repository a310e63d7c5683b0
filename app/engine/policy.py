"""Draft-length policies. They change how much is drafted, never what is emitted."""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepOutcome:
    """One step of the loop, as a draft-length policy learns from it."""

    drafted: int  # the proposer's own draft tokens (those looked up on top of them cost it nothing)
    accepted: int  # of those
    draft_seconds: float = 0.0  # drafting alone (the draft's catch-up before it is timed apart)
    target_seconds: float = 0.0
    verified: int | None = None  # tokens in the target's pass (default drafted + 1; more with looked-up ones)
    catch_up_tokens: int = 0  # tokens the draft was fed before it drafted
    catch_up_seconds: float = 0.0
    copies: Sequence[int] = ()  # the step's copy of earlier text, proposed or passed over
    copies_at: int = 0  # the position among the step's tokens the copy was for
    emitted: Sequence[int] = ()  # the tokens the step emitted
    context: int = 0  # tokens in the target's cache before the step (0: unknown)
    judged: bool = True  # whether the target reached the drafted tokens (a copy before them may end the step first)


@dataclass
class FixedK:
    k: int
    keep_drafting = None  # the draft drafts exactly k, the user's choice
    use_copies = None  # and copies earlier text wherever it can

    def next_k(self, remaining: int, catch_up: int, generated: int = 0) -> int:
        return self.k

    def observe(self, outcome: StepOutcome) -> None:
        pass


@dataclass
class RunningAcceptance:
    """The chance that the target accepts a proposed token, with older steps fading out. The prior
    counts as 3 accepted and 1 rejected: 0.75."""

    accepted: float = 3.0
    rejected: float = 1.0
    fading: float = 0.85

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def observe(self, n_accepted: int, rejected: bool) -> None:
        """A step's leading accepted tokens, and whether one was rejected after them."""
        self.accepted = self.fading * self.accepted + n_accepted
        self.rejected = self.fading * self.rejected + rejected


def context_bucket(context: int) -> int:
    """0 below 512 tokens, then one bucket per doubling: 512, 1,024, 2,048, 4,096, 8,192 and up."""
    return min(max(context // 256, 1).bit_length() - 1, 5)


def _along(points: dict[int, float], n: int) -> float:
    """seconds at n, interpolated (or extrapolated) along the measured {size: seconds}."""
    if n in points:
        return points[n]
    sizes = sorted(points)
    below = [p for p in sizes if p < n][-1:] or sizes[:1]
    above = [p for p in sizes if p > n][:1] or sizes[-2:-1] or below
    (x0, x1) = (below[0], above[0]) if below[0] != above[0] else (below[0], below[0] + 1)
    y0, y1 = points[x0], points.get(x1, points[x0])
    return max(y0 + (y1 - y0) * (n - x0) / (x1 - x0), min(points.values()))


@dataclass
class CopyAcceptance:
    """The chance that the target accepts a copied token, by the copy's length: a copy is as long
    as the match it follows, and a long match is the passage itself where a short one is often a
    common phrase."""

    bounds: tuple[int, ...] = (1, 2, 3, 7)  # copies of 1, 2, 3, 4 to 7, 8 and more tokens
    # Before any was seen, a copy after one matching token is taken for right one time in ten,
    # after two one in four, after three one in two, a longer one three in four: a 1-token copy
    # pays from about one in ten, and copies passed over are learnt from too.
    priors: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.75)
    by_length: dict[int, RunningAcceptance] = field(default_factory=dict)

    def of(self, n_copies: int) -> RunningAcceptance:
        bucket = sum(n_copies > bound for bound in self.bounds)
        if bucket not in self.by_length:  # the prior weighs as four copied tokens
            self.by_length[bucket] = RunningAcceptance(4 * self.priors[bucket], 4 * (1 - self.priors[bucket]))
        return self.by_length[bucket]


@dataclass
class CostModel:
    """Measured seconds of one draft token, of the draft's catch-up per token (feeding it the
    prompt or plain-step tokens in one pass) and of one target pass over n tokens, and the
    lengths of the latest answers. It belongs to an engine (its hardware and models) and lives
    across requests."""

    draft_token: float | None = None
    verify: dict[int, float] = field(default_factory=dict)  # tokens in the pass -> seconds, at a short context
    # The same at longer contexts, by context bucket (context_bucket): attention over 2,000 tokens
    # made a pass over 9 tokens 1.35x and one over 17 1.5x what it costs at 32 here, a pass over
    # one 1.1x. A bucket's few measured sizes scale the short-context curve near them.
    verify_at: dict[int, dict[int, float]] = field(default_factory=dict)
    context: int = 0  # the context length the passes to come run at
    catch_up_token: float = 0.0
    smoothing: float = 0.3
    # One slow pass (another program, the machine's noise) may raise an estimate by at most this
    # factor's share; a lasting slowdown is still followed within about ten steps, and a faster
    # pass counts in full. Without the cap a bench run here ended believing 3-token passes cost
    # 142 ms (about 45 in fact): slow passes had priced drafting out, so it was never measured again.
    max_rise: float = 1.25
    # The latest answers' lengths in tokens: what the next one's is expected to be like.
    answers: deque = field(default_factory=lambda: deque(maxlen=3))
    # The chance that the target accepts a drafted token and a copied one, learnt across requests
    # (each request starting from the prior paid some losing steps before it learnt again)
    drafted: RunningAcceptance = field(default_factory=lambda: RunningAcceptance())
    copied: CopyAcceptance = field(default_factory=CopyAcceptance)

    def observe_answer(self, n_tokens: int) -> None:
        self.answers.append(n_tokens)

    @property
    def typical_answer(self) -> float | None:
        """The latest answers' mean length; None before the first."""
        return sum(self.answers) / len(self.answers) if self.answers else None

    def observe(self, n_drafted: int, draft_seconds: float, n_verified: int, target_seconds: float,
                context: int | None = None) -> None:
        """A step's drafted tokens and target pass, at `context` tokens (None: the current one)."""
        if context is not None:
            self.context = context
        if n_drafted:
            self.draft_token = self._blend(self.draft_token, draft_seconds / n_drafted)
        table = self._table(context_bucket(self.context))
        table[n_verified] = self._blend(table.get(n_verified), target_seconds)

    def observe_catch_up(self, n_tokens: int, seconds: float) -> None:
        # Short catch-ups (a few plain-step tokens) cost more per token and matter little. A long
        # one counts in full, rise or fall: reading a long prompt costs more per token than the
        # 64 tokens calibration timed (attention grows with it), and capped, the estimate took
        # several prompts to learn it while each paid a catch-up that did not pay.
        if n_tokens >= 32:
            per_token = seconds / n_tokens
            self.catch_up_token = per_token if n_tokens >= 256 else self._blend(self.catch_up_token or None, per_token)

    def verify_seconds(self, n: int) -> float:
        """A target pass over n tokens at the current context: the short-context curve,
        interpolated (or extrapolated) along its points, scaled as the nearest size measured in
        the context's bucket (or the nearest shorter bucket measured) was."""
        short = _along(self.verify, n)
        measured = [bucket for bucket in self.verify_at if bucket <= context_bucket(self.context)]
        if not measured:
            return short
        table = self.verify_at[max(measured)]
        nearest = min(table, key=lambda size: (abs(size - n), size))
        return short * table[nearest] / _along(self.verify, nearest)

    def _table(self, bucket: int) -> dict[int, float]:
        return self.verify if bucket == 0 else self.verify_at.setdefault(bucket, {})

    @property
    def ready(self) -> bool:
        return self.draft_token is not None and len(self.verify) >= 2

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * min(new, self.max_rise * old)


@dataclass
class CostAwareK:
    """Drafts while one more draft token is worth its time, and decodes plainly while drafting
    is not.

    After each drafted token, the product of the draft's probabilities of its tokens so far is
    the chance that the target accepts them all (the draft's probability of a token is close to
    the chance that the target agrees: on 10 GSM8K answers tokens drafted at 0.3-0.5 were accepted
    39% of the time, at 0.5-0.7 59%, at 0.7-0.9 82%, above 0.9 98%). One more token adds that
    chance times the running acceptance a of a drafted token, and costs a draft token plus one
    more row of the target's pass; the draft goes on while the one pays for the other at the rate
    drafting achieves (`rate`, set with each update): a step that repeats is best cut where the
    gain of the next piece of work falls below the average rate. So it drafts long where the
    draft is sure and verifying more is cheap, and stops at its first doubtful token.
    Drafting is worth its while when that rate, estimated as (1 - a^(k+1)) / (1 - a) tokens per
    step of k tokens at the best k, beats a plain step; else it decodes plainly, drafting a short
    probe after `probe_every` plain steps to look again. Every `explore_every`-th drafting step
    drafts on past where the rule stops once: a cost known only from calibration, or pushed up by
    one slow pass, is measured again.
    Before a draft that first has to catch up on many tokens (the prompt, a run of plain steps),
    it weighs that catch-up against the time drafting would save over the tokens left, so a long
    prompt with a short answer is decoded plainly rather than slower."""

    costs: CostModel
    k: int = 8  # the longest draft until the costs are known
    k_max: int = 16  # the longest draft
    probe_every: int = 8  # plain steps before the first probe
    max_probe_interval: int = 256
    probe: int = 2  # the longest probe
    resume: float = 1.05  # drafting comes back when it is expected to beat plain steps by this much
    restart: int = 4  # the longest draft of the first step back
    explore_every: int = 16
    plain_steps: int = 0
    drafting_steps: int = 0
    # Drafting must save twice its catch-up: near the break-even point the gain is small either
    # way, while both estimates err on the optimistic side on long prompts (the draft's cost per
    # prompt token, timed on 64 tokens, grows with the prompt's length through attention).
    catch_up_margin: float = 2.0
    probe_budget: float = 0.03  # a probe's catch-up may cost this share of the plain time left
    # The tokens still to come, for pricing a catch-up: as many as the answer has run so far, at
    # least as many as the latest answers had (costs.typical_answer; before any, this many), at most
    # the budget left (a cap, not a forecast). Priced over the whole budget, a
    # long article's reading would be paid for a short summary; with a fixed guess, answers of a
    # few tokens ("Canberra.") would pay the draft's reading of the prompt for nothing. A long
    # answer still earns the catch-up once it has shown itself long.
    first_answer: int = 128

    def __post_init__(self) -> None:
        self.drafted, self.copied = self.costs.drafted, self.costs.copied  # the engine's, across requests
        self.probe_interval = self.probe_every  # doubled after each probe that did not pay, reset by one that did
        self.drafting = True  # drafting pays (as far as is known): the steps draft up to k_max
        self.exploring = False  # this step drafts on past where the rule stops, once
        self.rate = 0.0  # expected tokens per second of drafting, at the best k for the running acceptance
        if self.costs.ready:
            self._choose()

    @property
    def acceptance(self) -> float:
        """The running chance that the target accepts a drafted token, learnt from what was offered
        (a draft that stopped itself and was wholly accepted counts no rejection)."""
        return self.drafted.rate

    def keep_drafting(self, confidences: list[float], copied: int = 0) -> bool:
        """confidences: the draft's probability of each token it drafted so far this step, after
        `copied` tokens copied from earlier text; whether it drafts one more (up to k). With no
        confidences: whether to draft on where the copy stops, as likely to be reached as the
        whole copy is to be accepted."""
        if not self.costs.ready:
            return True
        all_accepted = math.prod(confidences) * (self.copied.of(copied).rate ** copied if copied else 1.0)
        n = copied + len(confidences) + 1  # tokens in the target's pass so far
        extra_seconds = self.costs.draft_token + self.costs.verify_seconds(n + 1) - self.costs.verify_seconds(n)
        if all_accepted * self.acceptance >= self.rate * extra_seconds:
            return True
        exploring, self.exploring = self.exploring, False
        return exploring

    def observe(self, step: StepOutcome) -> None:
        """Learns the costs and the draft's and the copies' acceptance from one step."""
        self.costs.observe(step.drafted, step.draft_seconds, step.verified or step.drafted + 1, step.target_seconds,
                           step.context or None)
        self.costs.observe_catch_up(step.catch_up_tokens, step.catch_up_seconds)
        probed = bool(step.drafted) and not self.drafting and self.k > 0  # the probe it offered
        if step.drafted:
            if step.judged:
                self.drafted.observe(step.accepted, rejected=step.accepted < step.drafted)
            self.plain_steps = 0
            self.drafting_steps += 1
            self.exploring = self.drafting_steps % self.explore_every == self.explore_every - 1
        else:
            self.plain_steps += 1
        if self.costs.ready:
            self._choose(probed)
        self.observe_copies(step.copies, step.copies_at, step.emitted)

    def use_copies(self, k: int, n_copies: int) -> int:
        """How many of the n_copies tokens that followed the text's end earlier (DraftModelProposer's
        lookup) to propose in a step whose longest draft is k (0: none). A copy costs no model pass
        but a longer target pass, and it ends the draft model's drafting: it is taken as far as the
        tokens it is expected to bring (at the acceptance of copies this long) per second of the
        target's pass are most, when that beats the step it replaces: drafting's rate in a drafting
        step, a plain step's by the margin `resume` in a plain one (k = 0). Copying wherever it
        could cost speculative decoding about 5% on GSM8K and 3% on code on an Intel Xeon."""
        if not self.costs.ready:
            return n_copies
        copied = min(self.copied.of(n_copies).rate, 0.999)
        best, best_rate = 0, max(self.rate if k else 0.0, self.resume / self.costs.verify_seconds(1))
        for n in range(1, n_copies + 1):
            rate = (1 - copied ** (n + 1)) / (1 - copied) / self.costs.verify_seconds(n + 1)
            if rate >= best_rate:
                best, best_rate = n, rate
        return best

    def observe_copies(self, copies: Sequence[int], at: int, emitted: Sequence[int]) -> None:
        """copies: the step's copy of earlier text, proposed or passed over, for the step's tokens
        from position `at`; emitted: the tokens the step emitted. The copied tokens that match the
        emitted ones count as accepted, the first that does not as a rejection; those past the
        step's end say nothing."""
        compared = list(zip(copies, emitted[at:]))
        if not compared:
            return
        matched = next((i for i, (copy, token) in enumerate(compared) if copy != token), len(compared))
        self.copied.of(len(copies)).observe(matched, rejected=matched < len(compared))

    def next_k(self, remaining: int, catch_up: int, generated: int = 0) -> int:
        """The longest draft of the next step (0: a plain step), with `remaining` tokens left in
        the budget, `catch_up` tokens the draft must be fed before it can draft and `generated`
        tokens answered so far."""
        if self.k == 0 or catch_up == 0 or not self.costs.ready:
            return self.k
        expected = self.costs.typical_answer or self.first_answer
        to_come = min(remaining, max(generated, expected))
        catch_up_seconds = catch_up * self.costs.catch_up_token
        plain_step = self.costs.verify_seconds(1)
        saved = to_come * (plain_step - 1 / self.rate)
        if saved <= 0:  # a probe: worth looking again when its catch-up is a small part of what is left
            return self.k if catch_up_seconds <= self.probe_budget * to_come * plain_step else 0
        return self.k if saved >= self.catch_up_margin * catch_up_seconds else 0

    def expected_rate(self, k: int) -> float:
        """Expected tokens per second of a step drafting k tokens, each accepted at the running acceptance."""
        a = min(self.acceptance, 0.999)
        tokens = (1 - a ** (k + 1)) / (1 - a)
        return tokens / (k * self.costs.draft_token + self.costs.verify_seconds(k + 1))

    def _choose(self, probed: bool = False) -> None:
        """The drafting rate and the longest draft for the steps to come. Drafting goes on while it
        beats plain steps, and comes back only when it is expected to beat them by `resume`, at a
        short draft first (one lucky probe near the break-even point no longer flips the policy to
        its longest drafts); a probe that finds drafting still not paying doubles the wait for the
        next one, one that does resets it."""
        self.rate = max(map(self.expected_rate, range(1, self.k_max + 1)))
        gain = self.rate * self.costs.verify_seconds(1)
        if gain > (1 if self.drafting else self.resume):
            self.k = self.k_max if self.drafting else self.restart
            self.drafting, self.probe_interval = True, self.probe_every
            return
        self.drafting = False
        if probed:
            self.probe_interval = min(2 * self.probe_interval, self.max_probe_interval)
        self.k = self.probe if self.plain_steps >= self.probe_interval else 0


@dataclass
class TimeLedger:
    """Speculation never slower than plain decoding, by construction rather than by estimate.

    `saved` is what a request's speculation has gained so far: each drafting step's tokens times a
    plain step's cost, less the seconds the step took (a plain step is exactly what plain decoding
    does, so it counts nothing). A step may draft n tokens only while, were all of them rejected,
    `saved` would stay above -(epsilon x the time spent + one plain step); else it drafts fewer, or
    it is a plain step.
    So the decoding of any request, with a draft that is never right too, takes at most epsilon
    more than plain decoding plus one plain step, up to the error in a plain step's cost, which is
    measured on the request's own plain steps (at its context length) once it has taken some. The
    draft's reading of the prompt is prefill, weighed before it by the policy (next_k)."""

    costs: CostModel
    epsilon: float = 0.01
    saved: float = 0.0
    elapsed: float = 0.0
    plain_step: float | None = None  # seconds of this request's plain steps, smoothed

    def step_cost(self) -> float:
        return self.plain_step if self.plain_step is not None else self.costs.verify_seconds(1)

    def allow(self, k: int, catch_up: int = 0, copied: int = 0) -> int:
        """The longest draft, at most k, that the ledger allows now (0: a plain step); catch_up:
        the decoded tokens the draft must read first; copied: the copied tokens the step begins
        with. What a step may lose is priced by the cost model, against a plain step as it prices one."""
        if k == 0 or not self.costs.ready:
            return k
        reading = catch_up * self.costs.catch_up_token
        return self._longest(k, lambda n: reading + n * self.costs.draft_token + self.costs.verify_seconds(n + copied + 1))

    def allow_copies(self, n_copies: int) -> int:
        """The longest copy, at most n_copies tokens, that the ledger allows now: a copy costs the
        longer pass alone."""
        if n_copies == 0 or not self.costs.ready:
            return n_copies
        return self._longest(n_copies, lambda n: self.costs.verify_seconds(n + 1))

    def rules(self, policy: CostAwareK, catch_up: int) -> tuple[Callable[[list[float], int], bool],
                                                                 Callable[[int, int], int]]:
        """The policy's keep_drafting and use_copies for one step, held to what the ledger allows:
        a token drafted on after a copy spends from the account as one drafted alone does (a draft
        without a copy before it was held to the ledger's k before the step)."""
        def keep_drafting(confidences: list[float], copied: int = 0) -> bool:
            n = len(confidences) + 1  # the draft if it drafts one more
            return policy.keep_drafting(confidences, copied) and (not copied or self.allow(n, catch_up, copied) == n)

        def use_copies(k: int, n_copies: int) -> int:
            return self.allow_copies(policy.use_copies(k, n_copies))
        return keep_drafting, use_copies

    def _longest(self, n_max: int, seconds: Callable[[int], float]) -> int:
        """The largest n <= n_max whose step, all of its proposals rejected, keeps the account in
        credit: seconds(n) less the plain step it replaces within the budget (0: none does)."""
        plain = self.costs.verify_seconds(1)
        budget = self.saved + self.epsilon * self.elapsed + plain
        return next((n for n in range(n_max, 0, -1) if seconds(n) - plain <= budget), 0)

    def record(self, drafted: int, emitted: int, seconds: float) -> None:
        """A step's proposed tokens (copies included), its emitted ones and its decoding seconds."""
        self.elapsed += seconds
        if drafted == 0:
            self.plain_step = seconds if self.plain_step is None else 0.7 * self.plain_step + 0.3 * seconds
        else:
            self.saved += emitted * self.step_cost() - seconds


DraftLengthPolicy = FixedK | CostAwareK
