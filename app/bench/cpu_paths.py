"""`python -m app bench speed --cpu-paths`: the ways a CPU runs the models, in one run: the low-bit
kernel, the path of a machine without it (lowbit/fallback: int8 through torch's matmul) and the
float32 reference, each with plain and speculative decoding on the same prompts, interleaved."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from ..chat.prompt import chat_prompt_ids
from ..engine.choices import Precision
from ..engine.engine import SpeculativeEngine
from ..engine.flags import generation_options, load_options
from ..engine.lowbit.kernel import why_not_native
from ..engine.models.loading import load_model
from .data import read_jsonl
from ..engine.measuring import ModeTotals, engine_run

PATHS = ("kernel", "no kernel", "fp32 reference")


def run_cpu_paths(args: argparse.Namespace) -> dict:
    stage = lambda text, fraction: print(f"  {text}" + (f" {fraction:.0%}" if fraction is not None else ""), flush=True)
    chosen = load_options(args)
    loads = {  # (target precision, draft precision, kernel)
        "kernel": (chosen.precision, chosen.draft_precision, True),
        "no kernel": (chosen.precision, chosen.draft_precision, False),
        "fp32 reference": (Precision.FP32, Precision.FP32, True),
    }
    skipped = {}
    if why_not_native() is not None:  # this machine has no kernel: its low-bit loads run without it anyway
        skipped["kernel"] = why_not_native()
    engines = {}
    for path, (precision, draft_precision, kernel) in loads.items():
        if path in skipped:
            continue
        print(f"{path}:", flush=True)
        target = load_model(chosen.target, progress=stage, precision=precision, kernel=kernel)
        draft = load_model(chosen.draft, progress=stage, precision=draft_precision, kernel=kernel, held=target.memory_bytes)
        engines[path] = SpeculativeEngine(target, draft, chosen.draft_vocabulary, chosen.kv_cache_dtype)
    options = generation_options(args)
    any_engine = next(iter(engines.values()))
    prompts = [chat_prompt_ids(any_engine.target.tokenizer, [{"role": "user", "content": row["question"]}])
               for row in read_jsonl(args.data, args.limit)]
    runs = {(path, mode): engine_run(engine, replace(options, speculative=mode == "speculative"))
            for path, engine in engines.items() for mode in ("plain", "speculative")}
    for run in runs.values():  # warm-up: first calls allocate and are slow
        run(prompts[0], 8)
    totals = {key: ModeTotals() for key in runs}
    identical = {path: True for path in engines}
    for prompt in prompts:
        outputs = {}
        for (path, mode), run in runs.items():  # interleaved, so machine noise hits all paths alike
            start = time.perf_counter()
            result = run(prompt, args.max_new_tokens)
            totals[path, mode].add(result, time.perf_counter() - start, len(prompt))
            outputs[path, mode] = result.ids
        for path in engines:
            identical[path] &= outputs[path, "speculative"] == outputs[path, "plain"]
    reference = totals.get(("fp32 reference", "plain"))
    result = {
        "config": {"target": chosen.target, "draft": chosen.draft, "limit": len(prompts),
                   "max_new_tokens": args.max_new_tokens, "skipped": skipped},
        "paths": {path: {"target": engine.target.label, "draft": engine.draft.label if engine.draft else None,
                         "target_bytes": engine.target.memory_bytes,
                         "plain": totals[path, "plain"].summary(), "speculative": totals[path, "speculative"].summary(),
                         "plain_vs_fp32_plain": round(totals[path, "plain"].tokens_per_s / reference.tokens_per_s, 3)
                         if reference else None,
                         "identical": identical[path]}
                  for path, engine in engines.items()},
    }
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return result


def format_table(result: dict) -> str:
    lines = ["| path | target | plain tokens/s | speculative tokens/s | plain vs fp32 plain | target GiB | "
             "speculative = plain |", "|---|---|---:|---:|---:|---:|---|"]
    for path, row in result["paths"].items():
        versus = f"{row['plain_vs_fp32_plain']:.2f}x" if row["plain_vs_fp32_plain"] else ""
        lines.append(f"| {path} | {row['target']} | {row['plain']['tokens_per_s']:.2f} | "
                     f"{row['speculative']['tokens_per_s']:.2f} | {versus} | {row['target_bytes'] / 2**30:.2f} | "
                     f"{'yes' if row['identical'] else 'no'} |")
    for path, why in result["config"]["skipped"].items():
        lines.append(f"\n{path}: not run ({why})")
    return "\n".join(lines)
