"""`python -m app bench speed --server URL --plain-server URL`: a serving engine's own decoding of
the target, speculative (the server drafting with its draft) and plain (the same target served
without one), for 1, 4 and 8 concurrent chats, through the client the window uses.

Per chat: tokens per second as its user sees them (its tokens over its own wall time, the first
token's wait included); in total: every chat's tokens over the wall time of the batch. Greedy
answers of the two servers are compared token for token."""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import dataclass, replace

from ..chat.prompt import chat_prompt_ids
from ..engine.api import GenerationOptions, load_tokenizer
from ..engine.flags import generation_options
from ..engine.remote.engine import RemoteEngine
from ..engine.steps import Stats
from .data import read_jsonl

CHATS = (1, 4, 8)


@dataclass
class ChatRun:
    ids: list[int]
    stats: Stats


def _chats(engine: RemoteEngine, prompts: list[list[int]], options: GenerationOptions) -> tuple[list[ChatRun], float]:
    """The answers to `prompts`, all asked at once, each on a thread of its own; and the wall time."""
    runs: list[ChatRun | None] = [None] * len(prompts)
    errors: list[BaseException] = []

    def chat(index: int) -> None:
        try:
            steps = list(engine.generate(prompts[index], options))
            runs[index] = ChatRun([token.id for step in steps for token in step.tokens], steps[-1].stats)
        except BaseException as error:  # said after the batch
            errors.append(error)

    threads = [threading.Thread(target=chat, args=(index,)) for index in range(len(prompts))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return runs, time.perf_counter() - start


def _summary(runs: list[ChatRun], wall: float) -> dict:
    total = sum((run.stats for run in runs), Stats())
    return {"tokens": total.emitted, "tokens_per_s_total": round(total.emitted / wall, 2),
            "tokens_per_s_per_chat": round(sum(run.stats.tokens_per_s for run in runs) / len(runs), 2),
            "first_token_s": round(sum(run.stats.first_token_seconds or 0 for run in runs) / len(runs), 3),
            "acceptance_rate": round(total.acceptance_rate, 4) if total.drafted else None,
            "mean_accepted_length": round(1 + total.accepted / len(total.accepted_lengths), 3)
            if total.accepted_lengths else None}


def run_served_speed(args: argparse.Namespace) -> dict:
    tokenizer = load_tokenizer(args.target)
    servers = {"speculative": args.server, "plain": args.plain_server}
    key = os.environ.get("SPECCHAT_SERVER_KEY") or None
    engines = {mode: RemoteEngine.connect(url, args.server_model or None, tokenizer, key, args.target)
               for mode, url in servers.items() if url}
    questions = [row["question"] for row in read_jsonl(args.data, max(CHATS))]
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": question}]) for question in questions]
    options = generation_options(args, max_new_tokens=args.max_new_tokens)
    rows, answers = [], {}
    for mode, engine in engines.items():
        _chats(engine, prompts[:1], replace(options, max_new_tokens=4))  # the server's first request warms it
        for chats in CHATS:
            runs, wall = _chats(engine, prompts[:chats], options)
            answers[mode, chats] = [run.ids for run in runs]
            rows.append({"mode": mode, "chats": chats, **_summary(runs, wall)})
    identical = None
    if len(engines) == 2:
        pairs = [(a, b) for chats in CHATS for a, b in zip(answers["plain", chats], answers["speculative", chats])]
        identical = {"answers": len(pairs), "identical": sum(a == b for a, b in pairs)}
    result = {"config": {"target": args.target, "servers": servers, "max_new_tokens": args.max_new_tokens,
                         "temperature": options.sampling.temperature,
                         "speculation": {mode: engine.speculation.note for mode, engine in engines.items()}},
              "rows": rows, "greedy_identical": identical}
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


def format_table(result: dict) -> str:
    lines = ["| server | chats | tokens/s per chat | tokens/s in total | first token s | acceptance | mean accepted length |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        acceptance = f"{row['acceptance_rate']:.1%}" if row["acceptance_rate"] is not None else "–"
        length = f"{row['mean_accepted_length']:.2f}" if row["mean_accepted_length"] is not None else "–"
        lines.append(f"| {row['mode']} | {row['chats']} | {row['tokens_per_s_per_chat']:.2f} | "
                     f"{row['tokens_per_s_total']:.2f} | {row['first_token_s']:.2f} | {acceptance} | {length} |")
    same = result["greedy_identical"]
    if same is not None:
        lines.append(f"\nGreedy answers identical between the plain and the speculative server: "
                     f"{same['identical']} of {same['answers']}")
    return "\n".join(lines)
