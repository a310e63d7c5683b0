"""`python -m app models search|pull|list|rm`: the hub's models in a terminal, as `ollama pull`
and `lms get` do it, through the same engine modules as the window's model view."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="models", required=True)
    search = kinds.add_parser("search", help="search the hub: keywords, user/model or a URL")
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=10, help="repositories listed at most")
    pull = kinds.add_parser("pull", help="fetch a model into the hub cache (resumes an unfinished download)")
    pull.add_argument("repo", help="user/model or its URL")
    pull.add_argument("file", nargs="?", help="the GGUF file to fetch (default: the repository's only one, or its "
                                              "Q4_K_M); none for a transformers folder")
    kinds.add_parser("list", help="the models in the hub cache")
    remove = kinds.add_parser("rm", help="delete a model from the hub cache")
    remove.add_argument("repo")
    rank = kinds.add_parser("rank", help="measure which draft pays for a target on this machine")
    rank.add_argument("--target", default="default-target", help="a .gguf file, a model folder or a hub id")
    rank.add_argument("--drafts", help="comma-separated drafts to measure, 'lookup' for prompt lookup (default: "
                                       "the default draft, prompt lookup and the smaller GGUFs in the hub cache)")
    rank.add_argument("--prompts", type=int, default=3, help="prompts per candidate: your latest questions in the "
                                                             "chats when there are enough, else a built-in mixed set")
    rank.add_argument("--max-new-tokens", type=int, default=64)
    rank.add_argument("--budget", type=float, default=300, help="seconds after which no further prompt starts")
    rank.add_argument("--json", type=Path, help="write the table here")


def run_models(args: argparse.Namespace) -> int:
    from .engine.errors import ModelError
    from .engine.hub.access import HubError
    from .engine.hub.fetch import Cancelled

    try:
        return {"search": _search, "pull": _pull, "list": _list, "rm": _remove, "rank": _rank}[args.models](args)
    except (HubError, ModelError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (Cancelled, KeyboardInterrupt):  # Ctrl-C
        print("\nstopped: `models pull` again continues where it stopped", file=sys.stderr)
        return 130


def _search(args: argparse.Namespace) -> int:
    from .chat.model_library import offer_of
    from .engine.hub.catalog import search

    repos = search(args.query, args.limit)
    if not repos:
        print(f"nothing SpecChat can run matches '{args.query}' (GGUF files, or folders of "
              f"Qwen2/Qwen3, Llama or Gemma 2/3 models)")
        return 0
    for offer in map(offer_of, repos):
        notes = [note for note in ("gated" if offer.gated else "", f"{offer.downloads:,} downloads" if offer.downloads else "") if note]
        print(f"{offer.id}" + (f"  ({', '.join(notes)})" if notes else ""))
        if not offer.files:  # a repository named by its id
            print("  nothing SpecChat can run here")
        for file in offer.files:
            print(f"  {file.name or '(transformers folder)':<48} {_size(file.size):>9}  {file.quantization or '':<7} "
                  f"{'fits' if file.too_big is None else f'too big: {file.too_big}'}" + ("  [here]" if file.here else ""))
    return 0


def _pull(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .engine.hub.access import HubError
    from .engine.hub.catalog import files_to_pull, parse_query, repository
    from .engine.hub.fetch import pull_model

    repo_id, _ = parse_query(args.repo)
    if repo_id is None:
        raise HubError(f"'{args.repo}' is not a repository (user/model or its URL); `models search` finds them.")
    repo = repository(repo_id)
    bars = {}  # by file, made at its first report: a file already here, or refused, draws none

    def report(name, progress):
        if name not in bars:
            bars[name] = tqdm(total=progress.total, initial=progress.done - progress.fetched, unit="B",
                              unit_scale=True, desc=name[-40:])
        bars[name].n = progress.done
        bars[name].refresh()
    try:
        source = pull_model(repo, files_to_pull(repo, args.file), report)
    finally:  # Ctrl-C included: what was fetched stays for the next pull
        for bar in bars.values():
            bar.close()
    print(f"ready: {source}\n  use it as a model: python -m app chat --target {source}  (or add it in the window)")
    return 0


def _list(args: argparse.Namespace) -> int:
    from .engine.hub.access import cache_dir
    from .engine.hub.local import local_models, partial_bytes

    models = local_models()
    if not models:
        print(f"no models in the hub cache ({cache_dir()}); `models pull user/model` fetches one")
        return 0
    for model in models:
        unfinished = partial_bytes(model.repo_id)
        note = f"  ({_size(unfinished)} of an unfinished download)" if unfinished else ""
        print(f"{model.repo_id:<50} {_size(model.bytes):>9}{note}")
        for source in model.sources():
            print(f"  {source}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    from .engine.hub.catalog import parse_query
    from .engine.hub.local import remove

    repo_id = parse_query(args.repo)[0] or args.repo
    print(f"removed {repo_id}: {_size(remove(repo_id))} freed")
    return 0


def _rank(args: argparse.Namespace) -> int:
    from .chat.prompt import chat_prompt_ids
    from .engine.choices import GenerationOptions, LoadOptions
    from .engine.draft_finder import LOOKUP, rank_drafts, remember
    from .engine.models.loading import load_model

    load = LoadOptions(target=args.target)
    say = lambda text: print(f"  {text}", file=sys.stderr, flush=True)
    target = load_model(args.target, progress=lambda stage, fraction: say(stage), precision=load.precision)
    drafts = [LOOKUP if d.strip() == "lookup" else d.strip() for d in args.drafts.split(",")] if args.drafts \
        else _default_drafts(target)
    questions = _questions(args.prompts)
    prompts = [chat_prompt_ids(target.tokenizer, [{"role": "user", "content": q}]) for q in questions]
    ranked = rank_drafts(target, drafts, prompts, GenerationOptions(), lambda name: load_model(
        name, progress=lambda stage, fraction: say(stage), precision=load.draft_precision, held=target.memory_bytes),
        args.max_new_tokens, args.budget, say)
    remember(target, ranked)
    print(f"drafts for {target.name} on this machine ({len(prompts)} prompts x {args.max_new_tokens} tokens, "
          f"greedy, adaptive k):")
    print(f"{'':3}{'draft':<40} {'speed-up':>8} {'decode':>7} {'accepted':>8} {'tokens/pass':>11} {'memory':>9}  identical")
    for place, row in enumerate(ranked, 1):
        if row.speedup is None:
            print(f"{'-':>2} {row.draft:<40} not measured: {row.note}")
            continue
        print(f"{place:>2} {row.draft:<40} {row.speedup:>7.2f}x {row.decode_speedup or 0:>6.2f}x "
              f"{(row.acceptance or 0):>8.0%} {row.tokens_per_pass or 0:>11.2f} {_size(row.memory_bytes) if row.memory_bytes else '-':>9}  "
              f"{'yes' if row.identical else 'NO' if row.identical is False else '-'}")
    best = ranked[0] if ranked and ranked[0].speedup else None
    if best is not None:
        pair = "--proposer lookup" if best.draft == LOOKUP else f"--draft {best.draft}"
        verdict = "pays" if best.speedup >= 1.0 else "does not pay: plain decoding is faster here"
        print(f"best: {best.draft} ({verdict}); use this pair: python -m app chat --target {args.target} {pair}")
    if args.json:
        args.json.write_text(json.dumps({"target": target.name, "rows": [asdict(r) for r in ranked]}, indent=1))
    return 0


def _default_drafts(target) -> list[str]:
    """The default draft, prompt lookup, and the GGUFs in the hub cache smaller than the target."""
    from .engine.draft_finder import LOOKUP
    from .engine.hub.local import local_models

    smaller = [str(path) for model in local_models() for path in model.files
               if path.suffix == ".gguf" and path.stat().st_size < target.memory_bytes / 2]
    return ["default-draft", LOOKUP, *smaller[:4]]


def _questions(count: int) -> list[str]:
    from .chat.store import ChatStore, StoreError, default_path
    from .engine.draft_finder import questions

    recent = []
    if default_path().exists():  # (no chats yet: none made by asking)
        try:
            store = ChatStore()
            try:
                recent = store.recent_questions(count)
            finally:
                store.close()
        except StoreError:
            pass
    return questions(recent, count)


def _size(size: int | None) -> str:
    from .chat.model_library import size_words

    return size_words(size)
