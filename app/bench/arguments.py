"""The benchmarks' flags, apart from the benchmarks: `python -m app` parses its command line before
it knows which command runs, and the window's start need not wait for what the benchmarks import."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..engine.flags import add_engine_arguments, add_server_arguments
from .data import DEFAULT_DATA_DIR


def speed_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR / "gsm8k_test.jsonl",
                        help="JSONL file with a 'question' field (default: GSM8K test)")
    parser.add_argument("--limit", type=int, default=3, help="number of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--hf-k", default="", help="constant draft lengths to try for HF assisted generation, e.g. 3,5")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face assisted generation")
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp (the optional .[peers] extra)")
    parser.add_argument("--no-packed-linear", action="store_true",
                        help="lever off (fp32 only): PyTorch's default fp32 linear instead of pre-packed oneDNN weights")
    parser.add_argument("--cpu-paths", action="store_true",
                        help="instead: the kernel, the path of a machine without it (int8 through torch's matmul) "
                             "and the fp32 reference, plain and speculative, on the same prompts")
    parser.add_argument("--json", type=Path, help="write the results here")
    add_server_arguments(parser)
    parser.add_argument("--plain-server", default="", metavar="URL",
                        help="with --server: the same target served without a draft, for plain decoding beside "
                             "the server's speculative decoding (1, 4 and 8 concurrent chats)")


def seed_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--tasks", default="gsm8k,mmlu,cnndm")
    parser.add_argument("--limit", type=int, default=20, help="items per task")
    parser.add_argument("--max-new-tokens", type=int, help="answer budget (default per task: 256, 64, 128)")
    parser.add_argument("--json", type=Path, default=Path("seed.json"), help="results (a .md table and a .png plot beside it)")
    parser.add_argument("--resume", type=Path, help="JSONL of finished items: reused, and extended as items finish")
    parser.add_argument("--modes", default="plain,speculative",
                        help="which decodings to run per item; a reference run needs only one (greedy speculative "
                             "output equals plain output)")
    parser.add_argument("--reference", type=Path,
                        help="another run's --resume JSONL (e.g. --precision fp32): its scores on the same items and "
                             "how often its greedy answer equals this run's are reported beside this run's")


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR / "gsm8k_test.jsonl",
                        help="JSONL file with a 'question' field (default: GSM8K test)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, help="write the results here")


def ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=4000, help="answer length in tokens")
    parser.add_argument("--messages", type=int, default=50, help="messages already in the chat")
    parser.add_argument("--tokens-per-update", type=int, default=3,
                        help="tokens per repaint (the window repaints at most every 40 ms)")
    parser.add_argument("--full-render", action="store_true",
                        help="re-render the whole chat on each update (how the window streamed before), to compare")
    parser.add_argument("--json", type=Path, help="write the figures here")
