"""The peer to beat on CPU: llama.cpp (LM Studio's engine) through llama-cpp-python, on the same
GGUF files, prompt token ids and thread count. Optional: `pip install -e ".[peers]"` compiles
llama.cpp from source (about 10 minutes on 2 cores), so it is never a default or CI dependency.

Plain decoding is llama.cpp's own loop, each token chosen by its own sampler chain with our
settings (greedy at temperature 0). Speculative decoding follows `llama-speculative-simple`: the
draft proposes up to 8 tokens greedily, stopping early once its top probability falls below
0.75, the target verifies them in one batch, and a draft token stands while it equals what the
target's sampler picks at its place.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..engine.models import defaults as default_models
from ..engine.kv.kept_prefixes import common_prefix
from ..engine.models import prepared_copies as prepared
from ..engine.sampling import SamplingParams
from ..engine.measuring import RunResult

N_DRAFT_MAX = 8
DRAFT_P_MIN = 0.75
CONTEXT = 4096  # tokens: the long prompt and its answer fit


def unavailable_reason() -> str | None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return 'llama.cpp not installed (pip install -e ".[peers]" builds it, about 10 minutes)'
    return None


# A batch through llama.cpp in a child process: a fault in its kernels there ends that process,
# not the benchmark. The other files are loaded there too: one llama.cpp cannot read (a model
# folder, or a GGUF it refuses) had ended the benchmark with a ValueError.
_SMOKE_TEST = """
import sys
from llama_cpp import Llama
for path in sys.argv[3:]:
    Llama(path, n_ctx=64, n_threads=int(sys.argv[2]), verbose=False)
llm = Llama(sys.argv[1], n_ctx=256, n_threads=int(sys.argv[2]), verbose=False)
llm.eval(list(range(1, 65)))
"""


def crash_reason(gguf: Path, threads: int, *others: Path) -> str | None:
    """Why llama.cpp cannot run here, when it dies on a 64-token batch of `gguf` or fails to load
    it or one of `others`, in a child process (None when it runs). llama-cpp-python 0.3.36 built
    for a CPU with AMX (Intel Xeons since Sapphire Rapids) dies so, with an illegal instruction in
    its AMX kernels."""
    import signal
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", _SMOKE_TEST, str(gguf), str(threads), *map(str, others)],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "llama.cpp took over 5 minutes on a 64-token batch here; left out"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        cause = signal.Signals(-done.returncode).name
        hint = (" (llama-cpp-python 0.3.36's AMX kernels do on AMX CPUs: build it without them, see the README)"
                if cause == "SIGILL" else "")
        return f"llama.cpp died with {cause} on a 64-token batch on this CPU{hint}; left out"
    last_line = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return f"llama.cpp failed to load the files or run a 64-token batch here ({last_line}); left out"


# Both models loaded as a user's llama.cpp holds them (one context each, at the peer's length),
# each after a batch, in a child process of their own: the peer's speculative mode keeps a second
# instance of the target, whose buffers a user's llama.cpp would not hold.
_MEMORY = """
import sys, psutil
from llama_cpp import Llama
models = [Llama(path, n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[1]), verbose=False) for path in sys.argv[3:]]
for model in models:
    model.eval(list(range(1, 65)))
print(psutil.Process().memory_info().rss)
"""


def memory_bytes(target_gguf: Path, draft_gguf: Path, threads: int) -> int | None:
    """The resident memory of a process holding llama.cpp's target and draft, each having read a
    64-token batch (its mapped files' pages count as touched, as ours do); None if it fails."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _MEMORY, str(threads), str(CONTEXT), str(target_gguf), str(draft_gguf)],
                          capture_output=True, text=True, timeout=600)
    return int(done.stdout.split()[-1]) if done.returncode == 0 and done.stdout.strip() else None


def gguf_path(source: str, progress) -> Path:
    """The GGUF file of a source; the default pair is assembled from its installed parts."""
    packaged = default_models.DEFAULTS.get(source)
    if packaged is None:
        return Path(source).expanduser()
    return default_models.assemble(packaged, prepared.default_gguf(packaged), progress)


class LlamaPeer:
    def __init__(self, target_gguf: Path, draft_gguf: Path, threads: int, stop_tokens: frozenset[int],
                 sampling: SamplingParams = SamplingParams(), seed: int = 0) -> None:
        from llama_cpp import Llama

        common = {"n_ctx": CONTEXT, "n_threads": threads, "n_threads_batch": threads, "verbose": False}
        # Plain decoding needs only the last logits; verification needs every row of the batch.
        # Both target instances map the same file, so the weights are in memory once.
        self.target = Llama(str(target_gguf), logits_all=False, **common)
        self.verifier = Llama(str(target_gguf), logits_all=True, **common)
        self.draft = Llama(str(draft_gguf), logits_all=False, **common)
        self.stop_tokens = stop_tokens
        self.files = (target_gguf.name, draft_gguf.name)
        self.sampling, self.seed = sampling, seed

    def _sampler(self):
        """llama.cpp's sampler chain with our settings, as LM Studio sets it up: greedy at
        temperature 0, else top-k, top-p, min-p, then the temperature (llama.cpp's order; ours
        applies the temperature first, as transformers does) and a draw. A fresh chain per run,
        seeded alike."""
        from llama_cpp._internals import LlamaSampler

        chain, sampling = LlamaSampler(), self.sampling
        if sampling.temperature <= 0:
            chain.add_greedy()
            return chain
        if sampling.top_k > 0:
            chain.add_top_k(sampling.top_k)
        if sampling.top_p < 1:
            chain.add_top_p(sampling.top_p, 1)
        if sampling.min_p > 0:
            chain.add_min_p(sampling.min_p, 1)
        chain.add_temp(sampling.temperature)
        chain.add_dist(self.seed)
        return chain

    def describe(self) -> str:
        import llama_cpp

        # Which of its kernels run: the build's instruction sets (e.g. "AVX2 = 1 | ... | AVX512_VNNI = 1")
        features = llama_cpp.llama_print_system_info().decode()
        isa = "AVX-512" if "AVX512 = 1" in features else "AVX2" if "AVX2 = 1" in features else "no AVX2"
        sampling = self.sampling
        chosen = "greedy" if sampling.temperature <= 0 else (
            f"its sampler: temperature {sampling.temperature}, top-k {sampling.top_k}, top-p {sampling.top_p}, "
            f"min-p {sampling.min_p}")
        return (f"llama.cpp via llama-cpp-python {llama_cpp.__version__} ({isa} build) on {self.files[0]} "
                f"(draft {self.files[1]}), {chosen}; speculative: draft up to {N_DRAFT_MAX}, p-min {DRAFT_P_MIN}")

    def plain(self, prompt: list[int], max_new_tokens: int):
        llm, sampler = self.target, self._sampler()
        _truncate(llm, 0)
        start = time.perf_counter()
        llm.eval(prompt)
        prefill = time.perf_counter() - start
        out: list[int] = []
        first = None
        while True:
            token = sampler.sample(llm._ctx, -1)
            out.append(token)
            first = time.perf_counter() - start if first is None else first
            if token in self.stop_tokens or len(out) >= max_new_tokens:
                return RunResult(out, prefill_seconds=prefill, first_token_seconds=first)
            llm.eval([token])

    def speculative(self, prompt: list[int], max_new_tokens: int):
        target, draft, sampler = self.verifier, self.draft, self._sampler()
        committed = list(prompt)
        start = time.perf_counter()
        for llm in (target, draft):  # the last prompt token goes in with the first draft
            _truncate(llm, 0)
            llm.eval(prompt[:-1])
        prefill = time.perf_counter() - start
        out: list[int] = []
        first = None
        while True:
            draft.eval(committed[draft.n_tokens :])
            proposed: list[int] = []
            while len(proposed) < min(N_DRAFT_MAX, max_new_tokens - len(out) - 1):
                logits = _last_logits(draft)
                token = int(np.argmax(logits))
                if 1.0 / np.exp(logits - logits[token]).sum() < DRAFT_P_MIN:
                    break
                proposed.append(token)
                draft.eval([token])
            target.eval([committed[-1]] + proposed)
            # The target's pick at each place in turn (row i of the batch), while it agrees.
            choices = [sampler.sample(target._ctx, 0)]
            while len(choices) <= len(proposed) and proposed[len(choices) - 1] == choices[-1]:
                choices.append(sampler.sample(target._ctx, len(choices)))
            first = time.perf_counter() - start if first is None else first
            for token in choices:
                out.append(token)
                committed.append(token)
                if token in self.stop_tokens or len(out) >= max_new_tokens:
                    return RunResult(out, prefill_seconds=prefill, first_token_seconds=first)
            _truncate(target, len(committed) - 1)
            _truncate(draft, min(draft.n_tokens, len(committed) - 1))


    def first_token_seconds(self, conversation: list[int], prompt: list[int], keep: bool) -> float:
        """Seconds to the first token of `prompt` (a follow-up in a conversation) after the
        context read `conversation` (the earlier turns): keeping what it holds of the prompt's
        beginning, as llama.cpp's server and LM Studio do, or reading the prompt afresh."""
        llm = self.target
        _truncate(llm, 0)
        llm.eval(conversation)
        start = time.perf_counter()
        if not keep:
            _truncate(llm, 0)
        _first_token(llm, prompt)
        return time.perf_counter() - start

    def returned_first_token_seconds(self, conversation: list[int], other_chat: list[int], prompt: list[int]) -> float:
        """Seconds to the first token of `prompt` (a follow-up in a conversation) when the
        context last read another chat's prompt, with the conversation's state restored from a
        copy in memory, as llama.cpp's server keeps its prompt caches: llama.cpp's own state
        save and load (keys, values, last logits), not llama-cpp-python's save_state, which also
        copies a 311 MB score buffer a server does not keep."""
        import ctypes

        import llama_cpp

        llm = self.target
        _truncate(llm, 0)
        llm.eval(conversation)
        size = llama_cpp.llama_state_get_size(llm._ctx.ctx)
        saved = (ctypes.c_uint8 * size)()
        saved_size = llama_cpp.llama_state_get_data(llm._ctx.ctx, saved, size)
        saved_ids, saved_tokens = llm.input_ids[: llm.n_tokens].copy(), llm.n_tokens
        _truncate(llm, 0)
        llm.eval(other_chat)
        start = time.perf_counter()
        if llama_cpp.llama_state_set_data(llm._ctx.ctx, saved, saved_size) != saved_size:
            raise RuntimeError("llama.cpp could not load its saved state")
        llm.n_tokens = saved_tokens
        llm.input_ids[:saved_tokens] = saved_ids
        _first_token(llm, prompt)
        return time.perf_counter() - start


def _first_token(llm, prompt: list[int]) -> int:
    """The first token after `prompt`, keeping what the context holds of its beginning and
    reading the rest (the last prompt token is always read: its logits give the token)."""
    kept = common_prefix(llm.input_ids[: llm.n_tokens].tolist(), prompt[:-1])
    _truncate(llm, kept)
    llm.eval(prompt[kept:])
    return int(np.argmax(_last_logits(llm)))


def _last_logits(llm) -> np.ndarray:
    """The logits after the last evaluated token (a model built without logits_all keeps no scores)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def _truncate(llm, length: int) -> None:
    """Keep the first `length` tokens of the context (KV cache included)."""
    if llm.n_tokens > length:
        llm._ctx.kv_cache_seq_rm(-1, length, -1)
        llm.n_tokens = length
