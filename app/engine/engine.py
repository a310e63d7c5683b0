"""The engine's front door: a target, an optional draft, and one generate() per request.

One request at a time: each model has a single KV cache, kept from one request to the next (and
copies of earlier conversations' beside it) so that a follow-up reads only what its prompt adds
(see forget()).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import torch

from .models.decoder import Decoder, cached, pass_seconds
from .choices import COMMON_TOKENS, GenerationOptions, ProposerKind, draw_seed
from .draft_vocabulary import DraftVocabulary
from .errors import EngineBusyError, IncompatibleModelsError, PromptTooLongError
from .loop import Limits, read_ahead_into, speculative_generate
from .memory_check import check_caches_fit, check_context_fits
from .lowbit import kernel
from .models.loading import LoadedModel, check_compatible, shared_vocab_width
from .policy import CostAwareK, CostModel, FixedK, TimeLedger, context_bucket
from .kv.kept_prefixes import MIN_TOKENS, common_prefix
from .proposers import DraftModelProposer, NoProposer, PromptLookupProposer, Proposer
from .kv.saved_prefixes import SavedPrefixes, model_fingerprint, stores_under, trim
from .steps import FinishReason, Step

ANSWERED = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.CONTEXT)


# Greedy speculative output equals plain output token for token on the CPU, whose linear layers
# and attention compute each row of a pass alike whatever the pass's width. A GPU's do not.
GPU_ROUNDING = ("on a GPU a pass over several tokens rounds otherwise than a pass over one, and a near-tie "
                "between two tokens can go either way (each is still the target's choice; sampled, the "
                "distribution is exactly the target's)")


# The context (tokens) passes are also timed at: the policy prices passes by context length.
LONG_CALIBRATION = 512

class SpeculativeEngine:
    served_by: str | None = None  # the models run here (a RemoteEngine names its server)

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None,
                 draft_vocabulary: int = COMMON_TOKENS, kv_cache: torch.dtype | None = None) -> None:
        """draft_vocabulary: a low-bit draft drafts only this many most common tokens and
        those of the conversation (0: all tokens); speed only, see draft_vocabulary.py.
        kv_cache: the low-bit models' native KV cache, float16 by default (see lean_decoder)."""
        width = None
        if draft is not None:
            check_compatible(draft, target)
            width = shared_vocab_width(draft, target)
        self.target, self.draft = target, draft
        self._target = cached(target.model, width, kv_cache)
        self._draft = cached(draft.model, width, kv_cache) if draft is not None else None
        self.draft_vocabulary = DraftVocabulary.for_draft(self._draft, width, draft_vocabulary) if draft is not None else None
        self.draft_refused: str | None = None  # why the draft chosen for this target was left out (for_pair)
        self.costs = CostModel()  # what a draft token and a verification cost here, across requests
        self._saved_root: Path | None = None  # where the models' caches are saved between runs
        self._busy = threading.Lock()

    @property
    def rounding_note(self) -> str | None:
        """Why greedy speculative output may part from plain output here, or None where it cannot."""
        return None if self.target.model.device.type == "cpu" else GPU_ROUNDING

    @property
    def vocabulary_size(self) -> int:
        return int(self.target.model.config.vocab_size)

    def spec_tokens(self, options: GenerationOptions) -> int:
        if not options.speculative:
            return 0
        return CostAwareK.k_max if options.adaptive else options.k

    @classmethod
    def for_pair(cls, target: LoadedModel, draft: LoadedModel, draft_vocabulary: int = COMMON_TOKENS,
                 kv_cache: torch.dtype | None = None) -> SpeculativeEngine:
        """The engine for a chosen pair; for a draft of another vocabulary than the target's (a
        Llama GGUF beside the default Qwen draft) the target alone, speculating by prompt lookup,
        rather than none, with draft_refused saying why."""
        try:
            return cls(target, draft, draft_vocabulary, kv_cache)
        except IncompatibleModelsError as error:
            engine = cls(target, None, kv_cache=kv_cache)
            engine.draft_refused = str(error)
            return engine

    def generate(
        self, prompt_ids: list[int], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Step]:
        """The steps of one answer, computed as they are iterated. One request at a time: each
        model has a single KV cache, so iterating a second request while one runs raises
        EngineBusyError."""
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("the engine is already generating an answer; stop it or wait for it")
        try:
            if options.adaptive and not self.costs.ready:
                self.calibrate()
            self._check_memory(len(prompt_ids) + options.max_new_tokens)
            seed = options.seed if options.seed is not None else draw_seed()
            generator = torch.Generator(device=self._target.device).manual_seed(seed)
            self.costs.context = len(prompt_ids)  # the first step's passes run at the prompt's length
            policy = CostAwareK(self.costs, k=options.k) if options.adaptive else FixedK(options.k)
            ledger = TimeLedger(self.costs) if options.adaptive else None  # the user's own k is theirs
            limits = Limits(options.max_new_tokens, self.target.context_length, self.target.stop_tokens)
            for step in speculative_generate(self._target, self._proposer(options, generator), policy, prompt_ids,
                                             options.sampling, limits, generator, cancel, ledger):
                if step.finish in ANSWERED:  # not a stopped one: its length says nothing of the next
                    self.costs.observe_answer(step.stats.emitted)
                yield step
        finally:
            self._busy.release()

    def read_ahead(self, prompt_ids: list[int], cancel: threading.Event) -> int:
        """Reads a prompt not sent yet (the message being typed) into the target's cache, then the
        draft's (so that speculation need not first catch up on a long message), until done or
        `cancel` is set (see loop.read_ahead_into); returns how many of its tokens the target's cache
        holds. Reads nothing while a request runs, when the prompt does not fit the context (its
        request will say so), or into a model whose requests read every prompt whole."""
        if (len(prompt_ids) >= self.target.context_length or not self._target.reuses_prefix
                or not self._busy.acquire(blocking=False)):
            return 0
        try:
            try:
                self._check_memory(len(prompt_ids))
            except PromptTooLongError:  # its request will say so
                return 0
            read = read_ahead_into(self._target, prompt_ids, cancel)
            if self._draft is not None and self._draft.reuses_prefix and not cancel.is_set():
                read_ahead_into(self._draft, prompt_ids, cancel)
            return read
        finally:
            self._busy.release()

    def _check_memory(self, tokens: int) -> None:
        """Refuses (PromptTooLongError) caches of `tokens` tokens, capped by the context, that would
        have to grow past the memory left; caches that hold room for them already take nothing more."""
        tokens = min(tokens, self.target.context_length)
        models = self._cached_models()
        per_token = sum(model.bytes_per_token for model in models)
        if sum(model.cache_bytes for model in models) < tokens * per_token:
            check_caches_fit(tokens, per_token, self.target.model.device)

    def check_context_fits(self) -> None:
        """Refuses (ModelError) a context whose caches, filled, would not fit the memory left."""
        per_token = sum(model.bytes_per_token for model in self._cached_models())
        check_context_fits(self.target.context_length, per_token, self.target.model.device)

    def forget(self) -> None:
        """Empty both models' caches and their kept copies: the next request reads its whole
        prompt, as a first one does (benchmarks time every run so). Otherwise each request keeps
        what earlier ones left that its prompt begins with (see kv/kept_prefixes.py)."""
        for model in self._cached_models():
            model.reset()
            model.prefixes.clear()

    def keep_saved_caches(self, folder: Path | None) -> None:
        """Offer each model the copies of its cache that an earlier run saved under `folder`
        (requests and read-aheads take them back as they take kept copies from memory), and save
        there with save_caches(); see saved_prefixes.py. None: no more."""
        self._saved_root = folder
        stores: dict[str, SavedPrefixes] = {}  # one per folder: a draft may be the target itself
        for loaded, model in self._loaded_and_cached():
            model.saved = None
            if model.reuses_prefix and folder is not None:
                arithmetic = (f"{model.cache_dtype}, kernel {kernel.build_id()}" if model.cache_dtype is not None
                              else "transformers")
                # the label names what runs the layers too (the kernel, or torch's int8 matmul)
                fingerprint = model_fingerprint(loaded.model, loaded.label, arithmetic, str(model.device))
                if fingerprint not in stores:
                    stores[fingerprint] = SavedPrefixes(folder / fingerprint)
                model.saved = stores[fingerprint]

    def save_caches(self, wait_seconds: float = 5.0) -> bool:
        """Write each model's cache and its kept copies (the most recent first) where
        keep_saved_caches() said; False when a request still ran after wait_seconds."""
        if not self._busy.acquire(timeout=wait_seconds):
            return False
        try:
            for model in self._cached_models():
                if model.saved is not None:
                    live = [model.snapshot(model.saved.max_tokens)] if model.length >= MIN_TOKENS else []
                    model.saved.save(live + model.prefixes.snapshots[::-1])
            if self._saved_root is not None:
                trim(self._saved_root)
            return True
        finally:
            self._busy.release()

    def forget_conversation(self, token_ids: list[int], wait_seconds: float = 5.0) -> bool:
        """Let go of every copy of a conversation (a deleted chat's) that the models hold, kept
        in memory or saved on disk (also those of other models, saved in earlier runs, that read
        the same token ids): whatever shares at least MIN_TOKENS tokens with token_ids. False when
        a request still ran after wait_seconds."""
        if not self._busy.acquire(timeout=wait_seconds):
            return False
        try:
            for model in self._cached_models():
                if common_prefix(model.ids, token_ids) >= MIN_TOKENS:
                    model.reset()
                model.prefixes.forget(token_ids)
            if self._saved_root is not None:
                open_stores = [model.saved for model in self._cached_models() if model.saved is not None]
                for store in stores_under(self._saved_root, open_stores):
                    store.forget(token_ids)
            return True
        finally:
            self._busy.release()

    @property
    def kv_cache(self) -> torch.dtype | None:
        """What the target's KV cache holds keys and values in, where the lean decoder keeps it
        (float16 by default, float32 on request or without the C++ kernel); None on transformers' path."""
        return self._target.cache_dtype

    def cache_bytes(self) -> int:
        """The memory both models' caches and their kept copies take."""
        return sum(model.cache_bytes + model.prefixes.nbytes for model in self._cached_models())

    def _cached_models(self) -> list[Decoder]:
        return [model for model in (self._target, self._draft) if model is not None]

    def _loaded_and_cached(self) -> list[tuple[LoadedModel, Decoder]]:
        return [(loaded, model) for loaded, model in ((self.target, self._target), (self.draft, self._draft))
                if model is not None]

    def calibrate(self) -> None:
        """Time target passes over 1..17 tokens (and a few after 512 tokens of context), a draft
        token and the draft's catch-up on 64 tokens once (about four seconds for the default pair,
        remembered: see calibration.py), so the cost-aware policy chooses well
        from the first step; later steps refine the figures. Runs on first use when nobody called
        it after loading. Every pass up to 8 tokens is timed: the AVX-512 kernel takes up to 7 rows
        in one block and 8 as two (4 + 4), so a straight line between points further apart misjudges
        the passes in between by 10-20% (at 4 rows a block, a line from 2 to 5 rows had kept the
        policy at k = 1)."""
        self.costs.verify.update(pass_seconds(self._target, (1, 2, 3, 4, 5, 6, 7, 8, 9, 17)))
        if self.target.context_length >= LONG_CALIBRATION + 17:  # and at a longer context (about 3 s more)
            self.costs.verify_at[context_bucket(LONG_CALIBRATION)] = pass_seconds(
                self._target, (1, 5, 9, 17), context=LONG_CALIBRATION)
        if self._draft is None:  # only prompt lookup drafts, at next to no cost
            self.costs.draft_token = 1e-5
            return
        draft = pass_seconds(self._draft, (1, 64), self.draft_vocabulary)
        self.costs.draft_token, self.costs.catch_up_token = draft[1], draft[64] / 64

    def _proposer(self, options: GenerationOptions, generator: torch.Generator) -> Proposer:
        if not options.speculative:
            return NoProposer()
        if options.proposer is ProposerKind.PROMPT_LOOKUP or self._draft is None:
            return PromptLookupProposer()  # (with no draft model, the speculation that needs none)
        return DraftModelProposer(self._draft, options.sampling, generator, self.draft_vocabulary, options.lookup,
                                  self.target.stop_tokens)

