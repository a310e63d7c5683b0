"""Command-line flags for the engine, shared by the terminal chat and both benchmarks, so every
entry point starts from the same defaults (`GenerationOptions()` and `LoadOptions()`)."""
from __future__ import annotations

import argparse
from dataclasses import replace

from .choices import (CACHE_TYPES, DEFAULTS, LOAD_DEFAULTS, GenerationOptions, LoadOptions, Precision, ProposerKind,
                      SamplingParams)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=LOAD_DEFAULTS.target, help="target model (folder, .gguf, hub id)")
    parser.add_argument("--draft", default=LOAD_DEFAULTS.draft, help="draft model (folder, .gguf, hub id)")
    choices = [p.value for p in Precision]
    parser.add_argument("--precision", choices=choices, default=LOAD_DEFAULTS.precision.value,
                        help="target weights on CPU: lowbit = the GGUF's own blocks, fp32 = dequantized reference")
    parser.add_argument("--draft-precision", choices=choices, default=LOAD_DEFAULTS.draft_precision.value,
                        help="draft weights on CPU (output unchanged: only the target decides)")
    parser.add_argument("--draft-vocabulary", type=int, default=LOAD_DEFAULTS.draft_vocabulary,
                        help="a low-bit draft drafts only this many most common tokens and the conversation's "
                             "(0: all; output unchanged)")
    parser.add_argument("--kv-cache", choices=CACHE_TYPES, default=LOAD_DEFAULTS.kv_cache,
                        help="the low-bit models' KV cache: float16 (half the memory, as llama.cpp's default) or "
                             "float32 (rounds as the reference; the output of either is exact under speculation)")
    parser.add_argument("--speculative", action=argparse.BooleanOptionalAction, default=DEFAULTS.speculative,
                        help="speculative decoding (off: plain target decoding)")
    parser.add_argument("-k", type=int, default=DEFAULTS.k, help="draft length (the starting length when adaptive)")
    parser.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=DEFAULTS.adaptive,
                        help="adaptive draft length: stops drafting when the draft is unsure")
    parser.add_argument("--proposer", choices=[p.value for p in ProposerKind], default=DEFAULTS.proposer.value,
                        help="draft model, or prompt lookup (n-gram, no model)")
    parser.add_argument("--lookup", type=int, default=DEFAULTS.lookup,
                        help="a draft model's draft takes up to this many tokens from earlier text where its last "
                             "three or more tokens occurred before, as many as matched (0: never; output unchanged)")
    parser.add_argument("--temperature", type=float, default=DEFAULTS.sampling.temperature,
                        help="0 = greedy (exactly the target's own output)")
    parser.add_argument("--top-k", type=int, default=DEFAULTS.sampling.top_k, help="0 = off")
    parser.add_argument("--top-p", type=float, default=DEFAULTS.sampling.top_p, help="1 = off")
    parser.add_argument("--min-p", type=float, default=DEFAULTS.sampling.min_p, help="0 = off")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default="", metavar="URL",
                        help="an OpenAI-compatible server (vLLM, another SpecChat) that serves the target, e.g. "
                             "http://gpu-box:8000/v1; --target then names the same model here for its tokenizer and "
                             "chat template, and the server drafts with its own draft (its key: SPECCHAT_SERVER_KEY)")
    parser.add_argument("--server-model", default="", metavar="NAME",
                        help="the served model's name (default: the server's first)")


def load_options(args: argparse.Namespace) -> LoadOptions:
    return LoadOptions(target=args.target, draft=args.draft, precision=Precision(args.precision),
                       draft_precision=Precision(args.draft_precision), draft_vocabulary=args.draft_vocabulary,
                       kv_cache=args.kv_cache, server=getattr(args, "server", ""),
                       server_model=getattr(args, "server_model", ""))


def generation_options(args: argparse.Namespace, **overrides) -> GenerationOptions:
    """The flags as options; `max_new_tokens` comes from the caller (benchmarks set their own budgets)."""
    options = GenerationOptions(
        speculative=args.speculative, proposer=ProposerKind(args.proposer), k=args.k, adaptive=args.adaptive,
        sampling=SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p),
        seed=args.seed, lookup=args.lookup,
    )
    return replace(options, **overrides)


def chat_options(args: argparse.Namespace) -> GenerationOptions:
    """The terminal chat's flags as options: generation_options and the chat's own."""
    options = generation_options(args, max_new_tokens=args.max_new_tokens)
    return replace(options, sampling=replace(options.sampling, repeat_penalty=args.repeat_penalty,
                                             repeat_last_n=args.repeat_last_n))
