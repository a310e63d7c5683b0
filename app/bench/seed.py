"""`python -m app bench seed`: the technique's claim on GSM8K, MMLU and CNN/DailyMail:
plain target greedy vs speculative greedy on the same models, scored the standard way."""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from ..chat.prompt import chat_prompt_ids
from ..engine.engine import GenerationOptions, SpeculativeEngine
from ..engine.devices import pick_device
from ..engine.models.loading import load_model
from ..engine.flags import generation_options, load_options
from .tasks import TASKS, Task


def build_engine(args: argparse.Namespace) -> SpeculativeEngine:
    device, dtype, why = pick_device()
    print(f"device: {why}")
    draft = load_model(args.draft, device, dtype, precision=args.draft_precision)
    return SpeculativeEngine(load_model(args.target, device, dtype, precision=args.precision), draft, args.draft_vocabulary,
                             load_options(args).kv_cache_dtype)


def run_item(engine: SpeculativeEngine, task: Task, row: dict, options: GenerationOptions,
             modes: tuple[str, ...] = ("plain", "speculative")) -> dict:
    tokenizer = engine.target.tokenizer
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": task.prompt(row)}])
    record = {"prompt_tokens": len(prompt)}
    token_ids = {}
    for mode in modes:
        speculative = mode == "speculative"
        engine.forget()  # both modes read the whole prompt
        start = time.perf_counter()
        steps = list(engine.generate(prompt, replace(options, speculative=speculative)))
        seconds = time.perf_counter() - start
        token_ids[mode] = [t.id for s in steps for t in s.tokens]
        text = tokenizer.decode(token_ids[mode], skip_special_tokens=True)
        stats = steps[-1].stats
        record[mode] = {"tokens": len(token_ids[mode]), "seconds": round(seconds, 3),
                        "prefill_seconds": round(stats.prefill_seconds, 3), "score": task.score(text, row),
                        "text": text, "drafted": stats.drafted, "accepted": stats.accepted, "looked_up": stats.looked_up,
                        "target_passes": stats.target_passes, "accepted_lengths": stats.accepted_lengths}
    if len(token_ids) == 2:
        record["identical"] = token_ids["plain"] == token_ids["speculative"]
    return record


def summarize(records: list[dict]) -> dict:
    modes = [mode for mode in ("plain", "speculative") if all(mode in r for r in records)]

    def rate(mode: str, less_prefill: bool = False) -> float:
        seconds = sum(r[mode]["seconds"] - (r[mode]["prefill_seconds"] if less_prefill else 0) for r in records)
        return sum(r[mode]["tokens"] for r in records) / seconds

    # Speculation speeds up generation, not the prompt's reading: decoding's own rate too (records
    # resumed from runs before it was saved have no prefill time)
    timed_prefill = all("prefill_seconds" in r[mode] for r in records for mode in modes)

    def quality(mode: str) -> dict:
        keys = records[0][mode]["score"]
        return {key: round(sum(r[mode]["score"][key] for r in records) / len(records), 4) for key in keys}

    out = {"items": len(records)}
    for mode in modes:
        out[f"{mode}_tokens_per_s"] = round(rate(mode), 3)
        if timed_prefill:
            out[f"{mode}_decode_tokens_per_s"] = round(rate(mode, less_prefill=True), 3)
    if len(modes) == 2:
        out["speedup"] = round(rate("speculative") / rate("plain"), 3)
        if timed_prefill:
            out["decode_speedup"] = round(rate("speculative", less_prefill=True) / rate("plain", less_prefill=True), 3)
    if "speculative" in modes:
        spec = [r["speculative"] for r in records]
        drafted = sum(s["drafted"] for s in spec)
        out["acceptance_rate"] = round(sum(s["accepted"] for s in spec) / drafted, 4) if drafted else 0.0
        out["mean_accepted_length"] = round(sum(s["tokens"] for s in spec) / sum(s["target_passes"] for s in spec), 3)
    for mode in modes:
        out[f"quality_{mode}"] = quality(mode)
    if len(modes) == 2:
        out["identical"] = all(r["identical"] for r in records)
    return out


def _greedy(record: dict) -> dict:
    """An item's greedy answer: plain decoding's, or speculative decoding's (the same tokens)."""
    return record.get("plain") or record["speculative"]


def compare_to_reference(records: list[dict], reference: dict[tuple[str, int], dict]) -> dict | None:
    """This run's greedy answers against another run's on the same items (same budget)."""
    pairs = [(_greedy(r), _greedy(reference[(r["task"], r["index"])])) for r in records
             if (r["task"], r["index"]) in reference]
    if not pairs:
        return None
    keys = pairs[0][0]["score"]
    mean = lambda which: {k: round(sum(p[which]["score"][k] for p in pairs) / len(pairs), 4) for k in keys}
    return {"items": len(pairs), "quality": mean(0), "reference_quality": mean(1),
            "same_text": round(sum(a["text"] == b["text"] for a, b in pairs) / len(pairs), 4),
            "same_score": round(sum(a["score"] == b["score"] for a, b in pairs) / len(pairs), 4)}


def _scores(quality: dict | None) -> str:
    return "–" if quality is None else ", ".join(f"{k} {v:.3f}" for k, v in quality.items())


def reference_table(comparisons: dict[str, dict], reference: Path) -> str:
    lines = [f"Against the reference run `{reference}` (greedy answers, same items):", "",
             "| task | items | quality (this run) | quality (reference) | same text | same score |",
             "|---|---:|---|---|---:|---:|"]
    for name, c in comparisons.items():
        lines.append(f"| {name} | {c['items']} | {_scores(c['quality'])} | {_scores(c['reference_quality'])} | "
                     f"{c['same_text']:.0%} | {c['same_score']:.0%} |")
    return "\n".join(lines)


def markdown_table(summary: dict[str, dict]) -> str:
    lines = ["| task | items | plain tok/s | speculative tok/s | speedup | decode speedup | acceptance "
             "| mean accepted length | quality plain | quality speculative | identical |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    number = lambda value, form: "–" if value is None else format(value, form)
    for name, s in summary.items():
        identical = "–" if "identical" not in s else str(s["identical"]).lower()
        lines.append(f"| {name} | {s['items']} | {number(s.get('plain_tokens_per_s'), '.2f')} | "
                     f"{number(s.get('speculative_tokens_per_s'), '.2f')} | {number(s.get('speedup'), '.2f')}"
                     f"{'x' if 'speedup' in s else ''} | {number(s.get('decode_speedup'), '.2f')}"
                     f"{'x' if 'decode_speedup' in s else ''} | {number(s.get('acceptance_rate'), '.1%')} | "
                     f"{number(s.get('mean_accepted_length'), '.2f')} | "
                     f"{_scores(s.get('quality_plain'))} | {_scores(s.get('quality_speculative'))} | {identical} |")
    return "\n".join(lines)


def plot(summary: dict[str, dict], records: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (speed, lengths) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(summary)
    places = range(len(names))
    if all("decode_speedup" in summary[n] for n in names):
        speed.bar([p - 0.2 for p in places], [summary[n]["speedup"] for n in names], width=0.4, color="#0072B2",
                  label="end to end")
        speed.bar([p + 0.2 for p in places], [summary[n]["decode_speedup"] for n in names], width=0.4,
                  color="#D55E00", label="decoding (prompt's reading left out)")
        speed.set_ylim(0, 1.35 * max(summary[n]["decode_speedup"] for n in names))  # room for the legend
        speed.legend(loc="upper right")
    else:
        speed.bar(places, [summary[n]["speedup"] for n in names], color="#0072B2")
    speed.set_xticks(list(places), names)
    speed.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    speed.set_title("Speedup over plain target decoding")
    speed.set_ylabel("x")
    top = max((max(r["speculative"]["accepted_lengths"], default=0) for n in names for r in records[n]), default=0)
    bins = [b - 0.5 for b in range(top + 2)]
    drafted = False
    for name, colour in zip(names, ("#0072B2", "#D55E00", "#AA3377")):
        values = [v for r in records[name] for v in r["speculative"]["accepted_lengths"]]
        if values:  # a task decoded plainly throughout has no drafting steps to show
            lengths.hist(values, bins=bins, histtype="step", linewidth=2, color=colour, label=name, density=True)
            drafted = True
    lengths.set_title("Accepted draft tokens per step")
    lengths.set_xlabel("accepted length")
    if drafted:
        lengths.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _load_resume(path: Path | None, max_new: dict[str, int]) -> dict[tuple[str, int], dict]:
    if path is None or not path.is_file():
        return {}
    done = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if record.get("max_new_tokens") == max_new.get(record.get("task")):
            done[(record["task"], record["index"])] = record
    return done


def _warm_up(engine: SpeculativeEngine, task: Task | None, rows: dict[str, list[dict]]) -> None:
    """The first calls allocate and would slow the first item; a few tokens in each mode first."""
    if task is None:
        return
    prompt = chat_prompt_ids(engine.target.tokenizer, [{"role": "user", "content": task.prompt(rows[task.name][0])}])
    for speculative in (False, True):
        list(engine.generate(prompt, GenerationOptions(speculative=speculative, max_new_tokens=8)))


def run_seed(args: argparse.Namespace, engine: SpeculativeEngine | None = None) -> dict:
    tasks = [TASKS[name] for name in args.tasks.split(",") if name]
    max_new = {t.name: args.max_new_tokens or t.max_new_tokens for t in tasks}
    rows = {t.name: t.rows(args.data_dir, args.limit) for t in tasks}
    done = _load_resume(args.resume, max_new)
    modes = tuple(mode for mode in ("plain", "speculative") if mode in args.modes.split(","))
    engine = engine or build_engine(args)
    _warm_up(engine, next((task for task in tasks if rows[task.name]), None), rows)
    records: dict[str, list[dict]] = {t.name: [] for t in tasks}
    with tqdm(total=sum(len(r) for r in rows.values()), desc="bench seed", unit="item") as bar:
        for task in tasks:
            options = generation_options(args, max_new_tokens=max_new[task.name])
            for index, row in enumerate(rows[task.name]):
                record = done.get((task.name, index))
                if record is None or not all(mode in record for mode in modes):
                    bar.set_postfix_str(f"{task.name} {index + 1}")
                    record = {"task": task.name, "index": index, "max_new_tokens": max_new[task.name],
                              **run_item(engine, task, row, options, modes)}
                    if args.resume:
                        with open(args.resume, "a", encoding="utf-8") as out:
                            out.write(json.dumps(record) + "\n")
                            out.flush()
                            os.fsync(out.fileno())
                records[task.name].append(record)
                bar.update()

    summary = {name: summarize(items) for name, items in records.items() if items}
    reference = _load_resume(args.reference, max_new)
    comparisons = {name: c for name, items in records.items() if items
                   and (c := compare_to_reference(items, reference)) is not None}
    result = {"config": {"target": engine.target.name, "draft": engine.draft.name, "precision": engine.target.label,
                         "draft_precision": engine.draft.label, "kv_cache": args.kv_cache, "k": args.k,
                         "adaptive": args.adaptive, "limit": args.limit, "max_new_tokens": max_new},
              "tasks": summary, "identical": all(s.get("identical", True) for s in summary.values())}
    table = markdown_table(summary)
    if comparisons:
        result["reference"] = {"path": str(args.reference), "tasks": comparisons}
        table += "\n\n" + reference_table(comparisons, args.reference)
    print(table)
    args.json.write_text(json.dumps(result, indent=2))
    args.json.with_suffix(".md").write_text(table + "\n")
    if len(modes) == 2:
        plot(summary, records, args.json.with_suffix(".png"))
    print(f"wrote {args.json} and {args.json.with_suffix('.md')}" + (" and the plot" if len(modes) == 2 else ""))
    return result
