"""`python -m app bench serve`: what serving costs. The same streamed requests (GSM8K questions,
one answer each) from 1, 4 and 8 concurrent clients, over HTTP to `python -m app serve` started
as a user starts it (a process of its own, with this command's engine flags), and straight
through the engine in this process in the same order (the engine answers one at a time either
way), with speculation on and off. Time to first token counts the wait for a turn."""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx

from ..chat.prompt import chat_prompt_ids
from ..engine.api import GenerationOptions, ModelPool
from ..engine.flags import generation_options, load_options
from .data import read_jsonl

CLIENTS = (1, 4, 8)
WARM_UP = "Hi"  # the request that tells the server is ready
ENGINE_FLAGS = ("target", "draft", "precision", "draft_precision", "draft_vocabulary", "kv_cache", "proposer", "lookup")


def _start_server(args: argparse.Namespace, speculative: bool) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    flags = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in ENGINE_FLAGS]
    flags += ["-k", str(args.k), "--speculative" if speculative else "--no-speculative",
              "--adaptive" if args.adaptive else "--no-adaptive"]
    server = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", str(port), *flags],
                              cwd=Path(__file__).resolve().parents[2], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    while True:  # 503 while its models load
        if server.poll() is not None:
            raise RuntimeError(f"python -m app serve ended with status {server.returncode}")
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200 and httpx.post(
                    f"{url}/completions", json={"prompt": WARM_UP, "max_tokens": 1}, timeout=60).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)


async def _over_http(url: str, questions: list[str], max_tokens: int) -> list[tuple[float, float, int]]:
    """(seconds to the first token, seconds to the end, tokens) per request, all sent at once."""
    start = time.perf_counter()

    async def ask(client: httpx.AsyncClient, question: str) -> tuple[float, float, int]:
        first, tokens = None, 0
        body = {"messages": [{"role": "user", "content": question}], "temperature": 0, "max_tokens": max_tokens,
                "stream": True}
        async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    choices = json.loads(line[6:])["choices"]
                    if choices and choices[0].get("provenance"):
                        first = first if first is not None else time.perf_counter() - start
                        tokens += len(choices[0]["provenance"])
        return first or 0.0, time.perf_counter() - start, tokens

    async with httpx.AsyncClient(timeout=600) as client:
        return await asyncio.gather(*(ask(client, question) for question in questions))


def _in_process(engine, questions: list[str], options: GenerationOptions) -> list[tuple[float, float, int]]:
    """The same requests one after another through the engine, timed from when all arrived."""
    results, start = [], time.perf_counter()
    for question in questions:
        prompt = chat_prompt_ids(engine.target.tokenizer, [{"role": "user", "content": question}])
        first, tokens = None, 0
        for step in engine.generate(prompt, options):
            if step.tokens:
                first = first if first is not None else time.perf_counter() - start
                tokens += len(step.tokens)
        results.append((first or 0.0, time.perf_counter() - start, tokens))
    return results


def _summary(results: list[tuple[float, float, int]]) -> dict:
    tokens, wall = sum(r[2] for r in results), max(r[1] for r in results)
    return {"tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
            "first_token_s": round(sum(r[0] for r in results) / len(results), 3)}


def run_serve_bench(args: argparse.Namespace) -> dict:
    questions = [row["question"] for row in read_jsonl(args.data, max(CLIENTS))]
    base = generation_options(args, max_new_tokens=args.max_new_tokens)
    over_http = {}
    for speculative in (True, False):
        server, url = _start_server(args, speculative)
        try:
            for clients in CLIENTS:
                over_http[speculative, clients] = _summary(asyncio.run(
                    _over_http(url, questions[:clients], args.max_new_tokens)))
        finally:
            server.terminate()
            server.wait(30)
    models = ModelPool()
    engine = models.engine(models.request(), load_options(args), lambda stage, fraction: None)
    rows = []
    for speculative in (True, False):
        options = replace(base, speculative=speculative)
        engine.forget()  # as a server starts: nothing cached, then its first request (it caches as the server's do)
        list(engine.generate(engine.target.tokenizer(WARM_UP, add_special_tokens=False).input_ids,
                             replace(options, max_new_tokens=1)))
        for clients in CLIENTS:
            local = _summary(_in_process(engine, questions[:clients], options))
            http = over_http[speculative, clients]
            rows.append({"speculative": speculative, "clients": clients, "http": http, "in_process": local,
                         "http_vs_in_process": round(http["tokens_per_s"] / local["tokens_per_s"], 3)})
    result = {"config": {"target": engine.target.name, "draft": engine.draft.name if engine.draft else None,
                         "max_new_tokens": args.max_new_tokens, "device": models.device_text}, "rows": rows}
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


def format_table(result: dict) -> str:
    lines = ["| mode | clients | tokens/s over HTTP | in process | HTTP / in process | first token s over HTTP | in process |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        lines.append(f"| {'speculative' if row['speculative'] else 'plain'} | {row['clients']} | "
                     f"{row['http']['tokens_per_s']:.2f} | {row['in_process']['tokens_per_s']:.2f} | "
                     f"{row['http_vs_in_process']:.2f}x | {row['http']['first_token_s']:.2f} | "
                     f"{row['in_process']['first_token_s']:.2f} |")
    return "\n".join(lines)
