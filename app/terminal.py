"""A terminal chat: the engine's stream with tokens coloured by provenance (ANSI)."""
from __future__ import annotations

import argparse
import sys
import time

from .chat.detokenize import IncrementalDecoder
from .chat.prompt import chat_prompt_ids
from .engine.engine import SpeculativeEngine
from .engine.errors import ModelError, PromptTooLongError
from .engine.models import load_model, pick_device
from .engine.steps import Source
from .options import generation_options, load_options

# Okabe-Ito-like colours that stay apart for colour-blind readers.
ANSI = {Source.ACCEPTED: "\033[38;5;39m", Source.CORRECTED: "\033[38;5;208m", Source.BONUS: "\033[38;5;178m",
        Source.PLAIN: ""}
RESET = "\033[0m"


def run_terminal_chat(args: argparse.Namespace) -> int:
    device, dtype, why = pick_device()
    print(f"SpecChat (terminal) on {why}", file=sys.stderr)
    progress = lambda stage, fraction: print(
        f"  {stage}" + (f" {fraction:.0%}" if fraction is not None else ""), file=sys.stderr, flush=True)
    try:
        draft = load_model(args.draft, device, dtype, progress, precision=args.draft_precision)
        target = load_model(args.target, device, dtype, progress, precision=args.precision)
        engine = SpeculativeEngine(target, draft, args.draft_vocabulary, load_options(args).kv_cache_dtype)
    except ModelError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    colour = sys.stdout.isatty()
    legend = " ".join(f"{ANSI[s]}{s.value}{RESET}" for s in Source) if colour else ""
    print(f"Ready ({target.name}: {target.precision}; draft {draft.name}: {draft.precision}). "
          f"Empty line or Ctrl-D quits. {legend}", file=sys.stderr)
    messages: list[dict[str, str]] = []
    options = generation_options(args, max_new_tokens=args.max_new_tokens)
    while True:
        try:
            user = input("> " if sys.stdin.isatty() else "")
        except EOFError:
            break
        if not user.strip():
            break
        messages.append({"role": "user", "content": user})
        decoder = IncrementalDecoder(target.tokenizer)
        start = time.perf_counter()
        try:
            for step in engine.generate(chat_prompt_ids(target.tokenizer, messages), options):
                for token in step.tokens:
                    piece = decoder.push(token.id)
                    print(f"{ANSI[token.source]}{piece}{RESET}" if colour else piece, end="", flush=True)
        except PromptTooLongError as error:
            print(f"\nerror: {error}", file=sys.stderr)
            messages.pop()
            continue
        except KeyboardInterrupt:
            print("\n[stopped]", file=sys.stderr)
        stats = step.stats
        seconds = time.perf_counter() - start
        print(f"\n[{stats.emitted} tokens, {stats.emitted / seconds:.2f} tokens/s, acceptance "
              f"{stats.acceptance_rate:.0%}, mean accepted length {stats.mean_accepted_length:.2f}]", file=sys.stderr)
        messages.append({"role": "assistant", "content": decoder.text})
    return 0
