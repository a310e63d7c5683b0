"""A terminal chat: the engine's stream with tokens coloured by provenance (ANSI)."""
from __future__ import annotations

import argparse
import sys
import time

from .chat.detokenize import IncrementalDecoder
from .chat.prompt import chat_prompt_ids
from .engine.api import (FinishReason, GenerationOptions, ModelError, ModelPool, PromptTooLongError, Source,
                         SpeculativeEngine)
from .engine.flags import chat_options, load_options
from .ui.theme import DARK


def _true_colour(hex_colour: str) -> str:
    red, green, blue = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"\033[38;2;{red};{green};{blue}m"


# The window's dark theme's colours (Okabe-Ito: apart for colour-blind readers), in 24-bit colour
ANSI = {source: _true_colour(DARK.colour(source)) for source in (Source.ACCEPTED, Source.CORRECTED, Source.BONUS)} | {
    Source.PLAIN: ""}
RESET = "\033[0m"
CONTINUE = "/continue"
# What a model writes may hold control characters: an escape sequence would act on the terminal
# (clear it, retitle it, move the cursor) instead of showing. Only newlines and tabs pass as they are.
_SHOWN_ESCAPED = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)] if chr(code) not in "\n\t"}


def printable(text: str) -> str:
    """`text` with its control characters written out (ESC as \\x1b), for a terminal."""
    return text.translate(_SHOWN_ESCAPED)


def run_terminal_chat(args: argparse.Namespace) -> int:
    progress = lambda stage, fraction: print(
        f"  {stage}" + (f" {fraction:.0%}" if fraction is not None else ""), file=sys.stderr, flush=True)
    models = ModelPool()  # as the window loads them
    try:
        engine = models.engine(models.request(), load_options(args), progress)
    except ModelError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    target = engine.target
    print(f"SpecChat (terminal) on {models.device_text}", file=sys.stderr)
    if engine.draft_refused:  # as the window: the target alone, by prompt lookup
        print(f"note: {engine.draft_refused}; {target.name} runs alone, speculating by prompt lookup", file=sys.stderr)
    colour = sys.stdout.isatty()
    legend = " ".join(f"{ANSI[s]}{s.value}{RESET}" for s in Source) if colour else ""
    drafting = f"draft {engine.draft.name}: {engine.draft.label}" if engine.draft else "no draft model"
    if engine.served_by:  # a target on a server drafts with the server's own draft
        drafting = engine.speculation.note
    print(f"Ready ({target.name}: {target.label}; {drafting}). "
          f"{CONTINUE} goes on with an answer cut short; an empty line or Ctrl-D quits. {legend}", file=sys.stderr)
    messages: list[dict[str, str]] = []
    options = chat_options(args)
    decoder: IncrementalDecoder | None = None  # the last answer's tokens and text
    cut_short = False  # the last answer stopped at its length limit or was stopped
    while True:
        try:
            user = input("> " if sys.stdin.isatty() else "")
        except EOFError:
            break
        if not user.strip():
            break
        continuing = user.strip() == CONTINUE
        if continuing:
            if decoder is None or not cut_short:
                print("nothing to continue: no answer was cut short", file=sys.stderr)
                continue
            # The answer's own tokens follow its prompt, so the model goes on where it stopped (under
            # greedy decoding, as a larger budget would have given it at once), as the window's Continue.
            prompt_ids = chat_prompt_ids(target.tokenizer, messages[:-1], args.thinking) + decoder.ids
        else:
            messages.append({"role": "user", "content": user})
            decoder = IncrementalDecoder(target.tokenizer)
            prompt_ids = chat_prompt_ids(target.tokenizer, messages, args.thinking)
        try:
            cut_short = _stream(engine, prompt_ids, options, decoder, colour)
        except PromptTooLongError as error:
            print(f"\nerror: {error}", file=sys.stderr)
            if not continuing:
                messages.pop()
                decoder = None
            continue
        if continuing:
            messages[-1]["content"] = decoder.text
        else:
            messages.append({"role": "assistant", "content": decoder.text})
    return 0


def _stream(engine: SpeculativeEngine, prompt_ids: list[int], options: GenerationOptions, decoder: IncrementalDecoder,
            colour: bool) -> bool:
    """Prints the answer to prompt_ids as it comes, its tokens pushed through decoder; returns
    whether it was cut short (its length limit, or Ctrl-C)."""
    start = time.perf_counter()
    step = None
    try:
        for step in engine.generate(prompt_ids, options):
            for token in step.tokens:
                piece = printable(decoder.push(token.id))
                print(f"{ANSI[token.source]}{piece}{RESET}" if colour else piece, end="", flush=True)
    except KeyboardInterrupt:
        print("\n[stopped]", file=sys.stderr)
        cut_short = True
    else:
        cut_short = step is not None and step.finish is FinishReason.LENGTH
    if step is not None:
        stats, seconds = step.stats, time.perf_counter() - start
        print(f"\n[{stats.emitted} tokens, {stats.emitted / seconds:.2f} tokens/s, acceptance "
              f"{stats.acceptance_rate:.0%}, mean accepted length {stats.mean_accepted_length:.2f}"
              + (f"; cut short: {CONTINUE} goes on" if cut_short else "") + "]", file=sys.stderr)
    return cut_short
