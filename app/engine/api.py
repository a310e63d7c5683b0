"""The engine as the layers above see it: the chat controller, the window, the server, the
terminal chat and the benchmarks ask their questions through these names.

Importing it imports neither torch nor transformers (seconds on a laptop): the window opens first,
and the heavy modules are imported by the models' load, on its thread (`ModelPool.engine`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .background import call_soon, in_thread, steps_of
from .choices import (CACHE_TYPES, CHAT_DEFAULTS, COMMON_TOKENS, DEFAULTS, LOAD_DEFAULTS, LOOKUP, GenerationOptions,
                      LoadOptions, Precision, ProposerKind, SamplingParams)
from .models import default_fetch
from .models.defaults import DEFAULTS as DEFAULT_MODELS, PackagedGGUF
from .errors import EngineBusyError, IncompatibleModelsError, ModelError, PromptTooLongError, in_one_line
from .files import cache_root, private_folder
from .interface import Engine
from .model_pool import ModelPool
from .models.prepared_copies import PreparedCopy, age_in_words, float_model, noted_precision, noted_source
from .models.prepared_copies import copies as prepared_copies, delete as delete_prepared_copy, folder as prepared_folder
from .steps import EmittedToken, FinishReason, Source, Stats, Step
from .turns import QueueFull, Turns

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from .engine import SpeculativeEngine
    from .models.loading import LoadedModel

__all__ = [
    "call_soon", "default_fetch", "CACHE_TYPES", "CHAT_DEFAULTS", "COMMON_TOKENS", "DEFAULTS", "DEFAULT_MODELS", "LOAD_DEFAULTS", "LOOKUP", "EmittedToken",
    "Engine", "EngineBusyError", "FinishReason", "GenerationOptions", "IncompatibleModelsError", "LoadOptions", "LoadedModel",
    "ModelError", "ModelPool", "PackagedGGUF", "Precision", "PreparedCopy", "PromptTooLongError", "ProposerKind", "SamplingParams",
    "Source", "SpeculativeEngine", "Stats", "Step", "age_in_words", "cache_root", "delete_prepared_copy",
    "float_model", "in_one_line", "in_thread", "load_tokenizer", "noted_precision", "noted_source",
    "prepared_copies", "prepared_folder", "private_folder", "steps_of", "vocabulary_mismatch", "QueueFull", "Turns",
]


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """A model's tokenizer alone (no weights); ModelError when it cannot be read."""
    from .models.loading import load_tokenizer as load

    return load(source)


def vocabulary_mismatch(draft: PreTrainedTokenizerBase, target: PreTrainedTokenizerBase, draft_name: str,
                        target_name: str) -> str | None:
    """Why a draft with this tokenizer cannot draft for that target (None: it can)."""
    from .models.loading import vocabulary_mismatch as mismatch

    return mismatch(draft, target, draft_name, target_name)


def __getattr__(name: str):
    """SpeculativeEngine and LoadedModel on first use (they import torch)."""
    if name == "SpeculativeEngine":
        from .engine import SpeculativeEngine

        return SpeculativeEngine
    if name == "LoadedModel":
        from .models.loading import LoadedModel

        return LoadedModel
    raise AttributeError(name)
