"""Command line: `python -m app` opens the window; `python -m app chat` chats in the terminal;
`python -m app serve` serves an OpenAI-compatible API; `python -m app models ...` finds and fetches
models; `python -m app export-hf` writes a model for vLLM; `python -m app bundle` builds an installable folder;
`python -m app bench speed ...` benchmarks."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .bundle import add_bundle_arguments
from .bench.arguments import seed_arguments, serve_arguments, speed_arguments, ui_arguments
from .engine.api import CHAT_DEFAULTS, DEFAULTS
from .engine.flags import add_engine_arguments, add_server_arguments, chat_options, generation_options
from .models_command import add_models_arguments


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specchat", description="Local chat with speculative decoding.")
    parser.add_argument("--screenshot", type=Path, metavar="PATH",
                        help="run one chat turn offscreen with the current settings and save a PNG of the window")
    parser.add_argument("--prompt", default="Write a Python function that checks whether a number is prime.",
                        help="the message for --screenshot")
    parser.add_argument("--dark", action="store_true", help="dark theme for --screenshot")
    parser.add_argument("--install-desktop-entry", action="store_true",
                        help="add SpecChat to the desktop's menu (a .desktop file and icons at 16-512 px) and exit")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print what the app does (status messages, messages sent, answers finished, errors) "
                             "to standard error")
    commands = parser.add_subparsers(dest="command")
    chat = commands.add_parser("chat", help="chat in the terminal")
    add_engine_arguments(chat)
    add_server_arguments(chat)
    chat.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    chat.add_argument("--repeat-penalty", type=float, default=CHAT_DEFAULTS.sampling.repeat_penalty,
                      help="each token among the last --repeat-last-n scores lower (1 = off); greedy decoding too")
    chat.add_argument("--repeat-last-n", type=int, default=DEFAULTS.sampling.repeat_last_n)
    chat.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=True,
                      help="off: a reasoning model whose chat template can switch thinking off (Qwen3) answers directly")
    serve = commands.add_parser("serve", help="serve an OpenAI-compatible API (with per-token provenance)")
    add_engine_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (any but loopback needs a key)")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--api-key", help="the key clients must send (default: SPECCHAT_API_KEY; none on loopback)")
    serve.add_argument("--allow-origin", action="append", metavar="ORIGIN",
                       help="a web origin (e.g. http://localhost:3000) whose pages may call the API; repeat for "
                            "more, '*' for any. Requests from web pages are refused otherwise")
    serve.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens,
                       help="an answer's length when a request does not say")
    serve.add_argument("--queue", type=int, default=16, help="requests that may wait for their turn while one runs (0: one at a time, no waiting)")
    export = commands.add_parser("export-hf", help="write a model as a Hugging Face folder (safetensors, bfloat16) "
                                                   "for a serving engine such as vLLM")
    export.add_argument("model", help="a .gguf file, a model folder, or default-target / default-draft")
    export.add_argument("folder", type=Path, help="the folder to write (must not exist yet)")
    add_models_arguments(commands.add_parser("models", help="find, fetch, list and remove models (the Hugging Face hub)"))
    add_bundle_arguments(commands.add_parser("bundle", help="build a one-folder bundle of the app with PyInstaller "
                                                            "(pip install -e '.[bundle]')"))
    bench = commands.add_parser("bench", help="headless benchmarks")
    bench_kinds = bench.add_subparsers(dest="bench", required=True)
    speed_arguments(bench_kinds.add_parser("speed", help="plain vs speculative vs HF assisted generation"))
    seed_arguments(bench_kinds.add_parser("seed", help="GSM8K, MMLU, CNN/DailyMail: speed and quality"))
    serve_arguments(bench_kinds.add_parser("serve", help="the API's tokens/s and first token for 1, 4 and 8 clients, "
                                                         "beside the same requests in process"))
    ui_arguments(bench_kinds.add_parser("ui", help="the window's cost per streaming update, at the start and end of a long answer"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:  # the app's own lines only, not every library's
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        logging.getLogger("specchat").addHandler(handler)
        logging.getLogger("specchat").setLevel(logging.INFO)
    try:  # a value out of range is refused before the models load, not after
        if args.command == "chat":
            chat_options(args)
        elif args.command == "serve" or args.command == "bench" and hasattr(args, "temperature"):
            generation_options(args)
    except ValueError as error:
        parser.error(str(error))
    if args.install_desktop_entry:
        from .desktop_entry import run_install

        return run_install()
    if args.command == "bundle":
        from .bundle import run_bundle

        return run_bundle(args)
    if args.command == "bench":
        from .engine.errors import ModelError

        try:
            if args.bench == "seed":
                from .bench.seed import run_seed

                run_seed(args)
            elif args.bench == "serve":
                from .bench.serving import run_serve_bench

                run_serve_bench(args)
            elif args.bench == "ui":
                from .ui.stream_benchmark import run_ui

                run_ui(args)
            elif args.cpu_paths:
                from .bench.cpu_paths import run_cpu_paths

                run_cpu_paths(args)
            elif args.server or args.plain_server:
                from .bench.served import run_served_speed

                run_served_speed(args)
            else:
                from .bench.speed import run_speed

                run_speed(args)
        except ModelError as error:  # a missing, corrupt or mismatched model: what is wrong, not a traceback
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
    if args.command == "models":
        from .models_command import run_models

        return run_models(args)
    if args.command == "export-hf":
        from .engine.errors import ModelError
        from .engine.models.export import export_hf

        try:
            folder = export_hf(args.model, args.folder, lambda stage, fraction: print(f"  {stage}", file=sys.stderr))
        except ModelError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"wrote {folder}: serve it with vLLM, e.g. vllm serve {folder}")
        return 0
    if args.command in ("chat", "serve") or args.command is None and args.screenshot:
        from .first_start import fetch_missing, screenshot_models

        if not fetch_missing([args.target, args.draft] if args.command else screenshot_models()):
            return 2
    if args.command == "serve":
        from .serve.command import run_server

        return run_server(args)
    if args.command == "chat":
        from .terminal import run_terminal_chat

        return run_terminal_chat(args)
    from .ui.app import run_gui, run_screenshot

    if args.screenshot:
        return run_screenshot(args.screenshot, args.prompt, args.dark)
    return run_gui()
