"""Command line: `python -m app` opens the chat; `python -m app bench speed ...` benchmarks."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specchat", description="Local chat with speculative decoding.")
    commands = parser.add_subparsers(dest="command")
    chat = commands.add_parser("chat", help="chat in the terminal")
    add_model_arguments(chat)
    bench = commands.add_parser("bench", help="headless benchmarks")
    bench_kinds = bench.add_subparsers(dest="bench", required=True)
    from .bench import speed

    speed.add_arguments(bench_kinds.add_parser("speed", help="plain vs speculative vs HF assisted generation"))
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="default-target", help="target model (folder, .gguf, hub id)")
    parser.add_argument("--draft", default="default-draft", help="draft model (folder, .gguf, hub id)")
    parser.add_argument("-k", type=int, default=4, help="draft length")
    parser.add_argument("--max-new-tokens", type=int, default=512)


COMMANDS = ("chat", "bench", "-h", "--help")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        argv.insert(0, "chat")  # the default command
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        from .bench.speed import run_speed

        run_speed(args)
        return 0
    from .terminal import run_terminal_chat

    return run_terminal_chat(args)
