"""Proposers: who drafts the next k tokens. Lifecycle: begin -> (propose -> commit)*."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from .cached_model import CachedModel
from .draft_vocabulary import DraftVocabulary
from .sampling import SamplingParams, logits_to_probs, sample


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] long
    probs: torch.Tensor | None  # [k, V]: the distribution each token was drawn from; None without a model
    # Seconds spent first feeding the draft model tokens committed while it was idle (the prompt,
    # plain steps): a one-off catch-up, not a cost per drafted token.
    catch_up_seconds: float = 0.0
    catch_up_tokens: int = 0

    def __len__(self) -> int:
        return self.tokens.shape[0]


class Proposer(Protocol):
    def begin(self, prompt_ids: list[int]) -> None: ...
    def behind(self) -> int: ...  # committed tokens it must first be fed before it can draft
    def propose(self, k: int, min_confidence: float = 0.0) -> Draft: ...
    def commit(self, n_accepted: int, next_token: int) -> None: ...


class _Committed:
    """Shared bookkeeping: the committed tokens and the last draft."""

    def begin(self, prompt_ids: list[int]) -> None:
        self.ids = list(prompt_ids)
        self.last_draft: list[int] = []

    def commit(self, n_accepted: int, next_token: int) -> None:
        self.ids += self.last_draft[:n_accepted] + [next_token]

    def behind(self) -> int:
        return 0


SHORT_CATCH_UP = 8  # committed tokens the draft model takes in with its first draft step


class DraftModelProposer(_Committed):
    """A small model drafts autoregressively with its own KV cache."""

    def __init__(self, model: CachedModel, params: SamplingParams, generator: torch.Generator | None,
                 vocabulary: DraftVocabulary | None = None) -> None:
        """vocabulary: the tokens it may draft (None: all); see draft_vocabulary.py."""
        self.model = model
        self.params = params
        self.generator = generator
        self.vocabulary = vocabulary

    def begin(self, prompt_ids: list[int]) -> None:
        super().begin(prompt_ids)
        self.model.reset()
        if self.vocabulary is not None:
            self.vocabulary.reset(prompt_ids)

    def propose(self, k: int, min_confidence: float = 0.0) -> Draft:
        # Feed what was committed since the cache last grew: usually the target's last token, after
        # a fully accepted draft also the last draft token; the prompt on the first draft, and the
        # tokens of plain steps after them. A few go with the first draft step (one pass over a
        # few tokens costs about what a pass over one does); a long catch-up is timed apart.
        pending = self.ids[self.model.length :]
        catch_up_seconds, catch_up_tokens = 0.0, self.behind()
        if catch_up_tokens:
            start = time.perf_counter()
            self.model.feed(torch.tensor(pending[:-1], dtype=torch.long))
            if self.model.device.type == "cuda":
                torch.cuda.synchronize()
            catch_up_seconds = time.perf_counter() - start
            pending = pending[-1:]
        logits = self._logits(pending)
        choices, probs = [], []  # columns of the logits: token ids, or positions in the vocabulary
        for i in range(k):
            step_probs = logits_to_probs(logits, self.params)
            choice = sample(step_probs, self.params, self.generator)
            choices.append(choice)
            probs.append(step_probs)
            # The confidence check is the only host sync inside the draft loop.
            if i == k - 1 or (min_confidence > 0 and float(step_probs[choice]) < min_confidence):
                break
            logits = self._logits(self._token_ids(choice.view(1)))
        tokens, probs = self._token_ids(torch.stack(choices)), torch.stack(probs)
        if self.vocabulary is not None:
            probs = self.vocabulary.spread(probs)
        draft = Draft(tokens, probs, catch_up_seconds, catch_up_tokens)
        self.last_draft = draft.tokens.tolist()
        return draft

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
        if self.vocabulary is not None:
            self.vocabulary.add([next_token])  # drafts are in it already


class PromptLookupProposer(_Committed):
    """Prompt lookup: find the latest earlier occurrence of the text's last n-gram and
    propose what followed it. No model, so no probabilities."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, k: int, min_confidence: float = 0.0) -> Draft:
        ids = torch.tensor(self.ids, dtype=torch.long)
        self.last_draft = []
        for n in range(min(self.max_ngram, len(self.ids) - 1), self.min_ngram - 1, -1):
            windows = ids[:-1].unfold(0, n, 1)  # [L-n, n]: every n-gram that has a successor
            hits = (windows == ids[-n:]).all(dim=1).nonzero().flatten()
            if hits.numel():
                start = int(hits[-1]) + n
                self.last_draft = self.ids[start : start + k]
                break
        return Draft(torch.tensor(self.last_draft, dtype=torch.long), None)


class NoProposer(_Committed):
    """Speculation off: nothing is drafted and every token is the target's own."""

    def propose(self, k: int, min_confidence: float = 0.0) -> Draft:
        return Draft(torch.empty(0, dtype=torch.long), None)
