"""What the user chooses for the engine, as plain values without torch: the window shows, checks
and stores them before the engine is imported (torch and transformers take seconds to import,
and the window opens first)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING

from .lowbit.cpu import machine_isa

if TYPE_CHECKING:
    import torch


class Precision(str, Enum):
    LOWBIT = "lowbit"  # the GGUF's own blocks (4-8 bits); float folders: 8 bits
    BITS4 = "4bit"  # every weight matrix re-quantized to 4 bits
    BITS3 = "3bit"  # the feed-forward matrices re-quantized to 3 bits, the others to 4
    FP32 = "fp32"  # dequantized float32: the reference
    INT8 = "int8"  # float32 with dynamically quantized int8 linears (torch.ao)

    @property
    def low_bit(self) -> bool:
        return self is Precision.LOWBIT or self.requantized_bits[0] is not None

    @property
    def requantized_bits(self) -> tuple[int | None, int | None]:
        """(bits of every weight matrix, bits of the feed-forward ones) when re-quantized, else None."""
        return {Precision.BITS4: (4, None), Precision.BITS3: (4, 3)}.get(self, (None, None))


def default_draft_precision() -> Precision:
    """The draft's precision by default: 3-bit feed-forward layers where the AVX-512 kernel runs
    them (a draft pass 6.9 -> 5.9 ms, speculative decoding 1.04-1.06x), 4 bits elsewhere: with
    the AVX2 and AVX-VNNI kernels unpacking 3 bits costs more than the bytes it saves (a draft pass
    6.5 -> 7.8 ms and 6.2 -> 6.8 ms here, speculative decoding 0.97x and 0.86x)."""
    return Precision.BITS3 if machine_isa() == "avx512" else Precision.BITS4


# The low-bit models' KV cache types (lean_decoder maps them to torch's). float16 by default, as
# llama.cpp's cache: half the memory, and half the bytes attention reads per token.
CACHE_TYPES = ("float16", "float32")
DEFAULT_CACHE = "float16"

COMMON_TOKENS = 32768  # a low-bit draft drafts over this many most common tokens: a fifth of the default pair's vocabulary


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    min_p: float = 0.0  # 0: keep every token; else only those at least min_p times the likeliest's probability
    # llama.cpp's repeat penalty (LM Studio's "Repeat Penalty"): each token among the text's last
    # repeat_last_n scores lower before anything else applies, greedy decoding included (1: off)
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < 1:
            raise ValueError(f"repeat_last_n must be >= 1, got {self.repeat_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class ProposerKind(str, Enum):
    DRAFT_MODEL = "draft"
    PROMPT_LOOKUP = "lookup"


LOOKUP = "prompt lookup"  # the draft finder's candidate without a draft model


@dataclass(frozen=True)
class GenerationOptions:
    """The one set of generation defaults: the window, the terminal chat and both benchmarks
    start from `GenerationOptions()` (tests/test_defaults.py checks that they do)."""

    speculative: bool = True
    proposer: ProposerKind = ProposerKind.DRAFT_MODEL
    k: int = 8  # the starting length when adaptive
    adaptive: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)  # greedy
    seed: int | None = None  # None: a fresh one each answer (draw_seed), saved with it
    max_new_tokens: int = 512
    # A draft model's draft takes up to this many tokens from earlier text where its last three or
    # more tokens occurred before, as many as matched (0: never); speed only, see DraftModelProposer.
    lookup: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.k <= 64:
            raise ValueError(f"k must be between 1 and 64, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not 0 <= self.lookup <= 64:
            raise ValueError(f"lookup must be between 0 and 64, got {self.lookup}")


SEED_LIMIT = 2**63 - 1  # a torch.Generator's seed, in a JSON integer every client can write


def draw_seed() -> int:
    """A fresh seed for a sampled answer that asked for none."""
    return secrets.randbelow(SEED_LIMIT + 1)


DEFAULTS = GenerationOptions()
# The chats' defaults (the window's and the terminal's) add a repeat penalty of 1.1, LM Studio's and
# Ollama's default: greedy decoding of the small default models otherwise often ends in a line
# repeated to the token limit. The benchmarks decode without one, as llama.cpp's own tools do.
CHAT_DEFAULTS = replace(DEFAULTS, sampling=replace(DEFAULTS.sampling, repeat_penalty=1.1))


@dataclass(frozen=True)
class LoadOptions:
    """Which models to load and how: the window's Models tab, and the engine flags of the command line."""

    target: str = "default-target"
    draft: str = "default-draft"
    precision: Precision = Precision.LOWBIT  # the target runs from the GGUF's own low-bit blocks
    # a cheaper draft never changes the answer; 3-bit feed-forward layers where the kernel gains from them
    draft_precision: Precision = field(default_factory=default_draft_precision)
    draft_vocabulary: int = COMMON_TOKENS  # speed only, too: the draft proposes common tokens and the conversation's
    kv_cache: str = DEFAULT_CACHE  # the low-bit models' cache: float16, as llama.cpp's; float32 rounds as the reference
    # An OpenAI-compatible server (vLLM, another SpecChat) serving the target: its URL ("" runs the
    # target here) and model name ("" its only one). The target above then gives the tokenizer and
    # chat template; the draft, if any, is the server's own.
    server: str = ""
    server_model: str = ""
    # The context a chat may fill, in tokens (0: the target's maximum): a smaller one bounds the
    # caches' memory, checked when the models load.
    context_length: int = 0
    device: str = "auto"  # "auto" (a GPU where torch sees one), "cpu", "cuda:N", "mps"; SPECCHAT_DEVICE overrides it

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        from .models.lean_decoder import CACHE_DTYPES  # torch's import waits for the models' load

        return CACHE_DTYPES[self.kv_cache]


LOAD_DEFAULTS = LoadOptions()
