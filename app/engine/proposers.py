"""Proposers: who drafts the next k tokens. Lifecycle: begin -> (propose -> commit)*."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .devices import synchronize
from .models.decoder import Decoder
from .draft_vocabulary import DraftVocabulary
from .kv.kept_prefixes import keep_prefix
from .sampling import SamplingParams, logits_to_probs, penalize_repeats, sample
from .steps import first_stop


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] long
    probs: torch.Tensor | None  # [k, V]: the distribution each token was drawn from; None without a model
    # Seconds spent first feeding the draft model tokens committed while it was idle (the prompt,
    # plain steps): a one-off catch-up, not a cost per drafted token.
    catch_up_seconds: float = 0.0
    catch_up_tokens: int = 0
    # Tokens looked up in earlier text, not drafted by the proposer (which drafted its own at the
    # policy's k): the first `lead` of the step's tokens (a copy the draft model continued), and
    # those after its own. The policy learns the proposer's cost and acceptance from its own alone.
    looked_up: int = 0
    # The step's copy of earlier text, proposed or passed over: its tokens and the step's position
    # they would take (0: the step's first token), so that the policy learns whether copies pay.
    copies: list[int] = field(default_factory=list)
    copies_at: int = 0
    lead: int = 0

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def own(self) -> int:
        return len(self) - self.looked_up

    def copied(self, position: int) -> bool:
        """Whether the step's token at `position` was looked up rather than drafted."""
        return not self.lead <= position < self.lead + self.own


# Called after each drafted token with the draft's probability of each token drafted so far in
# this step and the number of copied tokens before them: whether to draft one more (see the
# policies' keep_drafting). Called with no probabilities after a copy: whether to draft on from it.
KeepDrafting = Callable[[list[float], int], bool]
# Called where earlier text offers a copy, with (the policy's k, tokens the copy offers): how many
# of them to propose, 0 for none (see the policies' use_copies).
UseCopies = Callable[[int, int], int]


class Proposer(Protocol):
    # -> prompt tokens its model's cache still held from an earlier request (0 without a model)
    def begin(self, prompt_ids: list[int]) -> int: ...
    def behind(self) -> int: ...  # committed tokens it must first be fed before it can draft
    def propose(self, k: int, keep_drafting: KeepDrafting | None = None, limit: int | None = None,
                use_copies: UseCopies | None = None) -> Draft: ...
    def commit(self, n_accepted: int, next_token: int) -> None: ...


def continuation(ids: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last n tokens of ids
    (the longest n from max_ngram down to min_ngram that occurred before); [] when none did."""
    tensor = torch.tensor(ids, dtype=torch.long)
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        windows = tensor[:-1].unfold(0, n, 1)  # [L-n, n]: every n-gram that has a successor
        hits = (windows == tensor[-n:]).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return ids[start : start + k]
    return []


class SuffixIndex:
    """Every place each n-gram of a growing text began with a token after it, so that the longest
    earlier match of the text's end is found by extending the latest occurrences of its last n
    tokens backwards (suffix decoding's longest match, without its tree). In a long document
    common n-grams recur, and their latest occurrence is often the wrong one to copy from."""

    def __init__(self, n: int, longest: int = 64, candidates: int = 64) -> None:
        """longest: the longest match measured; candidates: the latest occurrences compared."""
        self.n, self.longest, self.candidates = n, longest, candidates
        self.reset([])

    def reset(self, ids: list[int]) -> None:
        self.ids: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}
        self.extend(ids)

    def extend(self, ids: list[int]) -> None:
        grown = len(self.ids)
        self.ids += ids
        for start in range(max(0, grown - self.n), len(self.ids) - self.n):
            self.starts.setdefault(tuple(self.ids[start : start + self.n]), []).append(start)

    def match(self, tail: list[int], k: int) -> tuple[list[int], int]:
        """For the indexed ids + tail: the copy from the earlier occurrence of its end that offers
        the longest one, and how many tokens matched there (at least n; ([], 0) where its last n
        tokens did not occur before). A copy is what followed the occurrence, at most k tokens and
        at most as many as matched (suffix decoding's rule: a 3-token match is as often a common
        phrase as the passage itself, a 12-token one is the passage); among equally long copies
        the longest match wins, then the latest. In a long document common n-grams recur, and
        their latest occurrence is often the wrong one; in a loop the latest has no copy left."""
        text = self.ids + tail if tail else self.ids
        end = len(text)
        if k <= 0 or end <= self.n:
            return [], 0
        last = text[-self.n :]
        # Occurrences that end in the tail or just before it are not indexed: looked for here.
        recent = [start for start in range(end - self.n - 1, max(len(self.ids) - self.n, 0) - 1, -1)
                  if text[start : start + self.n] == last]
        indexed = self.starts.get(tuple(last), [])
        best, best_start = (0, 0), -1  # (copy length, tokens matched) and where that copy follows
        for start in recent + indexed[: -self.candidates - 1 : -1]:
            matched = self.n
            while (matched < self.longest and start - matched + self.n > 0
                   and text[start - matched + self.n - 1] == text[end - matched - 1]):
                matched += 1
            offered = (min(k, matched, end - start - self.n), matched)
            if offered > best:
                best, best_start = offered, start
        if best_start < 0:
            return [], 0
        copy_length, matched = best
        return text[best_start + self.n : best_start + self.n + copy_length], matched


def _taken(copies: list[int], matched: int, k: int, use_copies: UseCopies | None) -> int:
    """How many of a copy's tokens to propose in a step whose longest draft is k: as the policy
    says, else the whole copy. Where the draft model drafts (k > 0, or no policy) a copy must
    follow at least LOOKUP_NGRAM matching tokens: a shorter match is the draft's to continue."""
    if not copies or (matched < LOOKUP_NGRAM and (k > 0 or use_copies is None)):
        return 0
    return len(copies) if use_copies is None else max(0, min(int(use_copies(k, len(copies))), len(copies)))


def _certain(token_ids: list[int], like: torch.Tensor) -> torch.Tensor:
    """[len(token_ids), V]: for each token a distribution certain of it, as `like` [n, V] is typed and placed."""
    certain = torch.zeros(len(token_ids), like.shape[-1], dtype=like.dtype, device=like.device)
    return certain.scatter_(1, torch.tensor(token_ids, device=like.device, dtype=torch.long).view(-1, 1), 1.0)


class _Committed:
    """Shared bookkeeping: the committed tokens and the last draft."""

    def begin(self, prompt_ids: list[int]) -> int:
        self.ids = list(prompt_ids)
        self.last_draft: list[int] = []
        return 0

    def commit(self, n_accepted: int, next_token: int) -> None:
        self.ids += self.last_draft[:n_accepted] + [next_token]

    def behind(self) -> int:
        return 0


SHORT_CATCH_UP = 8  # committed tokens the draft model takes in with its first draft step
# Tokens that must repeat before what followed them is proposed in a drafting step; a plain step
# (the policy drafts nothing) is offered copies after a single repeated token too: a 1-token copy
# lengthens a pass by a few percent, and pays where it is right one time in ten.
LOOKUP_NGRAM = 3


class DraftModelProposer(_Committed):
    """A small model drafts autoregressively with its own KV cache."""

    def __init__(self, model: Decoder, params: SamplingParams, generator: torch.Generator | None,
                 vocabulary: DraftVocabulary | None = None, lookup_tokens: int = 0,
                 stop_tokens: frozenset[int] = frozenset()) -> None:
        """vocabulary: the tokens it may draft (None: all); see draft_vocabulary.py.
        lookup_tokens: where the text's last LOOKUP_NGRAM or more tokens (committed or drafted)
        occurred before, up to this many tokens that followed the longest such match are proposed
        instead of drafted: free, with no model pass (summaries, code edits and answers quote their
        sources). 0: never.
        stop_tokens: the tokens that end an answer: a draft ends with the first it drafts."""
        self.model = model
        self.stop_tokens = stop_tokens
        self.params = params
        self.generator = generator
        self.vocabulary = vocabulary
        self.lookup_tokens = lookup_tokens
        self.earlier = SuffixIndex(1)  # of the committed tokens

    def begin(self, prompt_ids: list[int]) -> int:
        super().begin(prompt_ids)
        self.earlier.reset(prompt_ids)
        if self.vocabulary is not None:
            self.vocabulary.reset(prompt_ids)
        # Keep what the cache holds of the prompt but its last token, which the first draft step feeds.
        return keep_prefix(self.model, prompt_ids[:-1])

    def propose(self, k: int, keep_drafting: KeepDrafting | None = None, limit: int | None = None,
                use_copies: UseCopies | None = None) -> Draft:
        """k: tokens the draft model may draft at most (0: none); keep_drafting: after each drafted
        token, whether to go on (None: always); limit: tokens in all (default k); use_copies:
        how much of a copy of earlier text to propose where there is one (None: all)."""
        limit = k if limit is None else limit
        copies, matched = self._looked_up([], limit)
        lead = copies[: _taken(copies, matched, k, use_copies)]
        if (k == 0 or len(lead) >= limit or (lead and lead[-1] in self.stop_tokens)
                or (lead and keep_drafting is not None and not keep_drafting([], len(lead)))):
            # a copy alone, or a plain step: the model need not run, nor first be fed what it has not seen
            return self._draft(torch.tensor(lead, dtype=torch.long), None, looked_up=len(lead), copies=copies,
                               lead=len(lead))
        # Feed what was committed since the cache last grew: usually the target's last token, after
        # a fully accepted draft also the last draft token; the prompt on the first draft, and the
        # tokens of plain steps after them. A few go with the first draft step (one pass over a
        # few tokens costs about what a pass over one does); a long catch-up is timed apart. A
        # copy the step begins with goes with it too: the model drafts on from where it stops.
        pending = self.ids[self.model.length :]
        catch_up_seconds, catch_up_tokens = 0.0, self.behind()
        if catch_up_tokens:
            start = time.perf_counter()
            self.model.feed(torch.tensor(pending[:-1], dtype=torch.long))
            synchronize(self.model.device)
            catch_up_seconds = time.perf_counter() - start
            pending = pending[-1:]
        logits = self._logits(pending + lead)
        drafted: list[int] = []  # token ids, on the host for the stop and lookup checks
        probs, looked_up, confidences = [], [], []
        for i in range(min(k, limit - len(lead))):
            # penalised as the target's row for this token will be, so that the two agree
            text = self.ids[-self.params.repeat_last_n :] + lead + drafted
            columns_of = None if self.vocabulary is None else self.vocabulary.columns_of
            logits = penalize_repeats(logits.unsqueeze(0), text, [], self.params, columns_of)[0]
            step_probs = logits_to_probs(logits, self.params)
            choice = sample(step_probs, self.params, self.generator)  # a column of the logits
            drafted.append(int(self._token_ids(choice.view(1))))
            probs.append(step_probs)
            if keep_drafting is not None:
                # Reading the probability (and the token, above) are the draft loop's host syncs.
                confidences.append(float(step_probs[choice]))
                if not keep_drafting(confidences, len(lead)):
                    break
            if drafted[-1] in self.stop_tokens:
                break  # nothing after the answer's end is ever emitted
            if self.lookup_tokens:
                looked_up, matched = self._looked_up(lead + drafted, limit - len(lead) - len(drafted))
                looked_up = looked_up[: _taken(looked_up, matched, k, use_copies)]  # none taken: the model drafts on
            if looked_up or i == k - 1:
                break  # earlier text continues from here: the rest is looked up, not drafted
            logits = self._logits([drafted[-1]])
        probs = torch.stack(probs)
        if self.vocabulary is not None:
            probs = self.vocabulary.spread(probs)
        if lead or looked_up:
            # A looked-up token is drawn from a distribution certain of it: rejection sampling then
            # accepts it with the target's own probability, so the output stays exact.
            probs = torch.cat([_certain(lead, probs), probs, _certain(looked_up, probs)])
        tokens = torch.tensor(lead + drafted + looked_up)
        # the copy taken, else the one passed over at the start (the policy learns from both)
        copies, copies_at = (looked_up, len(lead) + len(drafted)) if looked_up else (copies, 0)
        return self._draft(tokens, probs, len(lead) + len(looked_up), catch_up_seconds, catch_up_tokens, copies,
                           copies_at, len(lead))

    def _looked_up(self, drafted: list[int], limit: int) -> tuple[list[int], int]:
        """Tokens that followed an earlier match of the committed and drafted tokens' end, and how
        many tokens matched (see SuffixIndex.match)."""
        if not self.lookup_tokens or limit <= 0:
            return [], 0
        looked_up, matched = self.earlier.match(drafted, min(self.lookup_tokens, limit))
        # Like a drafted one, a looked-up stop token ends the draft: nothing after it is emitted.
        stop = first_stop(looked_up, self.stop_tokens)
        return (looked_up if stop is None else looked_up[: stop + 1]), matched

    def _draft(self, tokens: torch.Tensor, probs: torch.Tensor | None, looked_up: int = 0,
               catch_up_seconds: float = 0.0, catch_up_tokens: int = 0, copies: list[int] | None = None,
               copies_at: int = 0, lead: int = 0) -> Draft:
        self.last_draft = tokens.tolist()
        return Draft(tokens, probs, catch_up_seconds, catch_up_tokens, looked_up, copies or [], copies_at, lead)

    def _logits(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Feeds token_ids -> the logits of the last position [V], or [S] over the vocabulary."""
        token_ids = torch.as_tensor(token_ids, dtype=torch.long)
        if self.vocabulary is None:
            return self.model.forward(token_ids, keep=1)[0]
        return self.model.forward(token_ids, keep=1, vocabulary=self.vocabulary)[0]

    def _token_ids(self, choices: torch.Tensor) -> torch.Tensor:
        return choices if self.vocabulary is None else self.vocabulary.ids[choices]

    def behind(self) -> int:
        # Up to SHORT_CATCH_UP tokens are fed with the first draft step, not caught up on.
        pending = len(self.ids) - self.model.length
        return 0 if pending <= SHORT_CATCH_UP else pending - 1

    def commit(self, n_accepted: int, next_token: int) -> None:
        # The cache holds the old ids plus all drafts but the last; keep the accepted part.
        self.model.rollback(min(self.model.length, len(self.ids) + n_accepted))
        super().commit(n_accepted, next_token)
        self.earlier.extend(self.ids[len(self.earlier.ids) :])
        if self.vocabulary is not None:
            self.vocabulary.answered(self.ids[-(n_accepted + 1) :])


class PromptLookupProposer(_Committed):
    """Prompt lookup: find the latest earlier occurrence of the text's last n-gram and
    propose what followed it. No model, so no probabilities."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, k: int, keep_drafting: KeepDrafting | None = None, limit: int | None = None,
                use_copies: UseCopies | None = None) -> Draft:
        self.last_draft = continuation(self.ids, k, self.max_ngram, self.min_ngram) if k else []
        return Draft(torch.tensor(self.last_draft, dtype=torch.long), None)


class NoProposer(_Committed):
    """Speculation off: nothing is drafted and every token is the target's own."""

    def propose(self, k: int, keep_drafting: KeepDrafting | None = None, limit: int | None = None,
                use_copies: UseCopies | None = None) -> Draft:
        return Draft(torch.empty(0, dtype=torch.long), None)
