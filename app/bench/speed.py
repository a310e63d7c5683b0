"""`python -m app bench speed`: plain target decoding vs our speculative decoding vs
Hugging Face assisted generation, on the same models, prompts and process."""
from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..chat.prompt import chat_prompt_ids
from ..engine.models.decoder import cached as cached_forward, pass_seconds
from ..engine.engine import GenerationOptions, SpeculativeEngine
from ..engine.lowbit.skeleton import as_transformers
from ..engine.devices import pick_device
from ..engine.models.loading import LoadedModel, load_model
from ..engine.flags import generation_options, load_options
from . import llama_peer
from .data import DEFAULT_DATA_DIR, read_jsonl
from ..engine.measuring import ModeTotals, Run, RunResult, engine_run

def hf_assisted(target: LoadedModel, draft: LoadedModel, k: int | None, options: GenerationOptions) -> Run:
    """k=None: transformers' defaults; else a constant draft length without confidence stops.
    Greedy, or sampled with our settings (transformers' order is ours)."""
    # transformers' own models around the same modules (the low-bit ones load without them)
    target_model, draft_model = as_transformers(target.model), as_transformers(draft.model)
    # generate() may adjust the assistant's config in place; every call starts from the original.
    pristine = copy.deepcopy(draft_model.generation_config)
    stop = sorted(target.stop_tokens)
    tuning = {} if k is None else {
        "num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0
    }

    sampling = options.sampling
    if sampling.temperature > 0:  # transformers skips a filter at top-k 0, top-p 1 and min-p None
        tuning |= {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k,
                   "top_p": sampling.top_p, "min_p": sampling.min_p or None}
    else:
        tuning |= {"do_sample": False}

    def run(prompt: list[int], max_new_tokens: int) -> RunResult:
        draft_model.generation_config = copy.deepcopy(pristine)
        input_ids = torch.tensor([prompt], device=target_model.device)
        torch.manual_seed(options.seed)  # transformers draws from torch's global generator
        with torch.inference_mode():
            out = target_model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft_model,
                max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=stop[0], **tuning,
            )
        return RunResult(out[0, len(prompt):].tolist())

    return run


FOLLOW_UP = "Check that answer step by step."
FOLLOW_UPS = 3  # conversations whose follow-up question is timed
RETURN_FOLLOW_UP = "Explain the first step in more detail."  # asked after a question in another chat


def first_step_seconds(engine: SpeculativeEngine, prompt: list[int], options: GenerationOptions) -> tuple[float, int]:
    """Seconds until the first step's tokens arrive, and the prompt tokens found in the cache."""
    start = time.perf_counter()
    steps = engine.generate(prompt, options)
    first = next(step for step in steps if step.tokens or step.finish)
    seconds = time.perf_counter() - start
    steps.close()
    return seconds, first.stats.cached_prompt_tokens


def follow_up_first_token(engine: SpeculativeEngine, options: GenerationOptions, question: str, prompt: list[int],
                          answer: list[int], other_chat: list[int], peer) -> dict:
    """Time to the first token of a follow-up question after an answer (the engine's caches
    hold what that answer's run left): with the conversation kept, as a chat keeps it; another
    follow-up after a question in another chat (other_chat, a prompt), as when the user comes
    back to the conversation; and read afresh. llama.cpp the same three ways, after reading the
    same conversation (coming back: restoring a saved copy of its state)."""
    tokenizer = engine.target.tokenizer
    messages = [{"role": "user", "content": question},
                {"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)}]
    follow_up = chat_prompt_ids(tokenizer, messages + [{"role": "user", "content": FOLLOW_UP}])
    record = {"prompt_tokens": len(follow_up)}
    record["ours_kept_seconds"], record["cached_tokens"] = first_step_seconds(engine, follow_up, options)
    first_step_seconds(engine, other_chat, options)
    back = chat_prompt_ids(tokenizer, messages + [{"role": "user", "content": RETURN_FOLLOW_UP}])
    record["ours_returned_seconds"], record["returned_cached_tokens"] = first_step_seconds(engine, back, options)
    engine.forget()
    record["ours_afresh_seconds"], _ = first_step_seconds(engine, follow_up, options)
    if peer is not None:
        conversation = prompt + answer[:-1]  # what a finished answer leaves in the context
        record["llama.cpp_kept_seconds"] = peer.first_token_seconds(conversation, follow_up, keep=True)
        record["llama.cpp_afresh_seconds"] = peer.first_token_seconds(conversation, follow_up, keep=False)
        record["llama.cpp_returned_seconds"] = peer.returned_first_token_seconds(conversation, other_chat, back)
    return {key: round(value, 3) if isinstance(value, float) else value for key, value in record.items()}


LONG_PROMPT_TOKENS = 2000  # about three news articles: a document pasted in to summarise
LONG_PROMPT_QUESTION = "Summarize the articles above in a few sentences."
RESTART_QUESTION = "Which of the articles above is the longest?"  # the same articles, after a restart


def long_prompt(tokenizer, data_dir: Path, tokens: int = LONG_PROMPT_TOKENS, question: str = LONG_PROMPT_QUESTION) -> list[int]:
    """The chat prompt of whole CNN/DailyMail articles, as many as reach `tokens`, then `question`."""
    articles, text = iter(read_jsonl(data_dir / "cnndm_test80.jsonl")), ""
    while len(tokenizer(text).input_ids) < tokens:
        text += next(articles)["article"] + "\n\n"
    return chat_prompt_ids(tokenizer, [{"role": "user", "content": text + question}])


def restarted_first_token(engine: SpeculativeEngine, options: GenerationOptions, prompt: list[int]) -> dict:
    """What the window's saved caches give a chat reopened after a restart: the models' caches
    (what the last run left) saved to a fresh folder as the window saves them at exit, the engine
    emptied as a new run starts, then the first token of `prompt` (the same articles with another
    question); and the same read afresh."""
    with tempfile.TemporaryDirectory() as folder:
        engine.keep_saved_caches(Path(folder))
        try:
            engine.save_caches()
            engine.forget()
            seconds, restored = first_step_seconds(engine, prompt, options)
        finally:
            engine.keep_saved_caches(None)
    engine.forget()
    afresh, _ = first_step_seconds(engine, prompt, options)
    return {"prompt_tokens": len(prompt), "ours_restarted_seconds": round(seconds, 3), "restored_tokens": restored,
            "ours_afresh_seconds": round(afresh, 3)}


def long_prompt_runs(runs: dict[str, Run], prompt: list[int], max_new_tokens: int) -> dict:
    """Each mode on the long prompt: first token (its reading), then the answer's pace."""
    record, outputs = {"prompt_tokens": len(prompt)}, {}
    for name, run in runs.items():
        start = time.perf_counter()
        result = run(prompt, max_new_tokens)
        seconds = time.perf_counter() - start if result.seconds is None else result.seconds
        outputs[name] = result.ids
        after_first = seconds - result.first_token_seconds
        record[name] = {"tokens": len(result.ids), "seconds": round(seconds, 2),
                        "first_token_seconds": round(result.first_token_seconds, 2),
                        "tokens_per_s_after_first": round((len(result.ids) - 1) / after_first, 2) if after_first > 0 else None}
    record["identical"] = all(ids == outputs["plain"] for name, ids in outputs.items() if not name.startswith("llama"))
    return record


def verify_cost_curve(model: LoadedModel, sizes=(1, 2, 4, 8, 12, 16), context: int = 128, repeats: int = 5,
                      vocabulary=None) -> dict:
    """Milliseconds of one pass over n new tokens after `context` cached ones (best of `repeats`):
    speculation pays while verifying k+1 tokens costs about as much as one. vocabulary: the
    draft's, to time the draft as it drafts."""
    forward = cached_forward(model.model)
    seconds = pass_seconds(forward, sizes, vocabulary, context=context, repeats=repeats)
    return {n: round(s * 1000, 2) for n, s in seconds.items()}


def run_speed(args: argparse.Namespace) -> dict:
    device, dtype, why = pick_device()
    print(f"device: {why}")
    stage = lambda text, fraction: print(f"  {text}" + (f" {fraction:.0%}" if fraction is not None else ""), flush=True)
    packed = not args.no_packed_linear
    draft = load_model(args.draft, device, dtype, progress=stage, precision=args.draft_precision, packed_linear=packed)
    target = load_model(args.target, device, dtype, progress=stage, precision=args.precision, packed_linear=packed)
    engine = SpeculativeEngine(target, draft, args.draft_vocabulary, load_options(args).kv_cache_dtype)
    rows = read_jsonl(args.data, args.limit)
    prompts = [chat_prompt_ids(target.tokenizer, [{"role": "user", "content": row["question"]}]) for row in rows]

    options = generation_options(args)
    modes: dict[str, Run] = {
        "plain": engine_run(engine, replace(options, speculative=False)),
        "speculative": engine_run(engine, replace(options, speculative=True)),
    }
    # The process's memory once both models have answered (their caches and work buffers then
    # allocated; a float model's weights, mapped from their file, then read), before HF's copies
    # and the peer's models join it
    for run in modes.values():
        run(prompts[0], 8)
    rss_in_use = _rss_bytes()
    if not args.no_hf:  # the same model objects in transformers' own assisted-generation loop
        modes["hf_assisted_default"] = hf_assisted(target, draft, None, options)
        for k in (int(v) for v in args.hf_k.split(",") if v):
            modes[f"hf_assisted_k{k}"] = hf_assisted(target, draft, k, options)
    peer_note, peer, peer_rss = None, None, None
    if not args.no_peer and device.type == "cpu":
        peer_note = llama_peer.unavailable_reason()
        if peer_note is None:
            target_gguf, draft_gguf = llama_peer.gguf_path(args.target, stage), llama_peer.gguf_path(args.draft, stage)
            peer_note = llama_peer.crash_reason(draft_gguf, torch.get_num_threads(), target_gguf)
        if peer_note is None:
            peer = llama_peer.LlamaPeer(target_gguf, draft_gguf, threads=torch.get_num_threads(),
                                        stop_tokens=target.stop_tokens, sampling=options.sampling, seed=options.seed)
            modes["llama.cpp_plain"] = peer.plain
            modes["llama.cpp_speculative"] = peer.speculative
            peer_note = peer.describe()
            peer_rss = llama_peer.memory_bytes(target_gguf, draft_gguf, torch.get_num_threads())
        print(f"peer: {peer_note}")

    print("verify cost (ms per target pass over n tokens):", curve := verify_cost_curve(target))
    print("draft cost (ms per draft pass over n tokens):", draft_curve := verify_cost_curve(draft, sizes=(1,), vocabulary=engine.draft_vocabulary))
    for run in modes.values():  # warm-up: first calls allocate and are slow
        run(prompts[0], 8)
    totals = {name: ModeTotals() for name in modes}
    per_prompt = []
    with tqdm(total=len(prompts) * len(modes), desc="bench speed", unit="run") as bar:
        for index, prompt in enumerate(prompts):
            record = {"index": index, "prompt_tokens": len(prompt), "modes": {}}
            outputs = {}
            for name, run in modes.items():  # interleaved, so machine noise hits all modes alike
                bar.set_postfix_str(f"prompt {index + 1} {name}")
                start = time.perf_counter()
                result = run(prompt, args.max_new_tokens)
                seconds = time.perf_counter() - start
                outputs[name] = result.ids
                totals[name].add(result, seconds, len(prompt))
                record["modes"][name] = {"tokens": len(result.ids), "seconds": round(seconds, 3),
                                         "same_as_plain": result.ids == outputs["plain"]}
            if "llama.cpp_plain" in outputs:  # is llama.cpp's speculation lossless against its own plain?
                record["modes"]["llama.cpp_speculative"]["same_as_llama_plain"] = (
                    outputs["llama.cpp_speculative"] == outputs["llama.cpp_plain"])
            if index < FOLLOW_UPS:  # the caches still hold our speculative run (the others keep their own)
                record["follow_up"] = follow_up_first_token(
                    engine, generation_options(args, speculative=True), rows[index]["question"], prompt,
                    outputs["speculative"], prompts[(index + 1) % len(prompts)], peer)
            per_prompt.append(record)
            bar.update(len(modes))
    long_runs = {name: modes[name] for name in ("speculative", "plain", "llama.cpp_plain") if name in modes}
    long_runs["speculative_read_ahead"] = engine_run(engine, replace(options, speculative=True), read_ahead=True)
    print(f"long prompt ({LONG_PROMPT_TOKENS}+ tokens of articles to summarise): {', '.join(long_runs)}", flush=True)
    long = long_prompt_runs(long_runs, long_prompt(target.tokenizer, DEFAULT_DATA_DIR), args.max_new_tokens)
    restarted = restarted_first_token(engine, replace(options, speculative=True),
                                      long_prompt(target.tokenizer, DEFAULT_DATA_DIR, question=RESTART_QUESTION))
    agreement = {name: sum(r["modes"][name]["same_as_plain"] for r in per_prompt) for name in modes}
    identical = agreement["speculative"] == len(prompts) and long["identical"]

    summaries = {name: total.summary() for name, total in totals.items()}
    speed = {name: total.tokens_per_s for name, total in totals.items()}
    hf_names = [name for name in modes if name.startswith("hf_")]
    best_hf = max(hf_names, key=speed.get) if hf_names else None
    decode = {name: summary.get("decode_tokens_per_s") for name, summary in summaries.items()}
    result = {
        "config": {
            "target": target.name, "draft": draft.name, "precision": target.label,
            "draft_precision": draft.label, "kv_cache": args.kv_cache, "device": why, "dtype": str(dtype).replace("torch.", ""),
            "torch_threads": torch.get_num_threads(), "data": str(args.data), "limit": len(prompts),
            "max_new_tokens": args.max_new_tokens, "k": args.k, "adaptive": args.adaptive, "packed_linear": packed,
            "proposer": args.proposer, "peer": peer_note,
            "draft_vocabulary": engine.draft_vocabulary.common if engine.draft_vocabulary else "all",
        },
        "memory": {"target_bytes": target.memory_bytes, "draft_bytes": draft.memory_bytes,
                   "process_rss_in_use_bytes": rss_in_use, "llama_cpp_rss_bytes": peer_rss},
        "follow_up": _follow_up_summary([r["follow_up"] for r in per_prompt if "follow_up" in r]),
        "long_prompt": long,
        "restarted": restarted,
        "verify_cost_ms": curve,
        "draft_cost_ms": draft_curve,
        # what the cost-aware policy believed at the end: the costs it chose k by
        "policy_cost_model_ms": {"draft_token": round(engine.costs.draft_token * 1000, 2),
                                 "verify": {n: round(s * 1000, 2) for n, s in sorted(engine.costs.verify.items())}},
        "modes": summaries,
        "per_prompt": per_prompt,
        "speedup_vs_plain": round(speed["speculative"] / speed["plain"], 3),
        "speedup_vs_hf_assisted": round(speed["speculative"] / speed[best_hf], 3) if best_hf else None,
        "best_hf_assisted": best_hf,
        "decode_speedup_vs_llama_cpp_plain": round(decode["speculative"] / decode["llama.cpp_plain"], 3)
        if decode.get("llama.cpp_plain") else None,
        "identical": identical,  # ours: speculative == plain greedy on every prompt, the long one too
        "rounding_note": engine.rounding_note,  # why they may differ on this device (None: they cannot)
        "prompts_matching_our_plain": agreement,
        "llama_cpp_speculative_matching_its_plain": sum(
            r["modes"]["llama.cpp_speculative"]["same_as_llama_plain"] for r in per_prompt) if "llama.cpp_plain" in modes else None,
    }
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return result


def _follow_up_summary(records: list[dict]) -> dict:
    """Means over the timed follow-ups."""
    if not records:
        return {}
    keys = [key for key in records[0] if all(key in r for r in records)]
    return {"question": FOLLOW_UP, "conversations": len(records),
            **{key: round(sum(r[key] for r in records) / len(records), 3) for key in keys}}


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def format_table(result: dict) -> str:
    plain = result["modes"]["plain"]["tokens_per_s"]
    lines = [
        "| mode | tokens | seconds | tokens/s | vs plain | decode tokens/s | prefill tokens/s | first token s | acceptance | mean accepted length |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, mode in result["modes"].items():
        acceptance = f"{mode['acceptance_rate']:.1%}" if "acceptance_rate" in mode else ""
        length = f"{mode['mean_accepted_length']:.2f}" if "mean_accepted_length" in mode else ""
        lines.append(
            f"| {name} | {mode['tokens']} | {mode['seconds']:.1f} | {mode['tokens_per_s']:.2f} | "
            f"{mode['tokens_per_s'] / plain:.2f}x | {mode.get('decode_tokens_per_s', '')} | "
            f"{mode.get('prefill_tokens_per_s', '')} | {mode.get('first_token_seconds', '')} | {acceptance} | {length} |"
        )
    versus_hf = (f"; vs best HF assisted ({result['best_hf_assisted']}): {result['speedup_vs_hf_assisted']:.2f}x"
                 if result["best_hf_assisted"] else "")
    versus_llama = (f"; decode vs llama.cpp plain: {result['decode_speedup_vs_llama_cpp_plain']:.2f}x"
                    if result.get("decode_speedup_vs_llama_cpp_plain") else "")
    memory = result["memory"]
    lines.append(f"\nspeedup vs plain: {result['speedup_vs_plain']:.2f}x{versus_hf}{versus_llama}; "
                 f"identical: {str(result['identical']).lower()}"
                 + (f" ({result['rounding_note']})" if result.get("rounding_note") else ""))
    total = result["config"]["limit"]
    lines.append("prompts whose output equals our plain greedy output: " + ", ".join(
        f"{name} {count}/{total}" for name, count in result["prompts_matching_our_plain"].items())
        + (f"; llama.cpp speculative equals llama.cpp plain on {result['llama_cpp_speculative_matching_its_plain']}/{total}"
           if result.get("llama_cpp_speculative_matching_its_plain") is not None else ""))
    if follow := result.get("follow_up"):
        peer_line = (f"; llama.cpp {follow['llama.cpp_kept_seconds']:.2f} s keeping its context "
                     f"(afresh {follow['llama.cpp_afresh_seconds']:.2f} s)" if "llama.cpp_kept_seconds" in follow else "")
        lines.append(f"follow-up question ({follow['conversations']} conversations, {follow['prompt_tokens']:.0f} prompt "
                     f"tokens on average, {follow['cached_tokens']:.0f} of them cached): first token ours "
                     f"{follow['ours_kept_seconds']:.2f} s (afresh {follow['ours_afresh_seconds']:.2f} s){peer_line}")
        if "ours_returned_seconds" in follow:
            peer_back = (f"; llama.cpp {follow['llama.cpp_returned_seconds']:.2f} s restoring its saved state"
                         if "llama.cpp_returned_seconds" in follow else "")
            lines.append(f"  another follow-up after a question in another chat: first token ours "
                         f"{follow['ours_returned_seconds']:.2f} s ({follow['returned_cached_tokens']:.0f} tokens restored)"
                         f"{peer_back}")
    if long := result.get("long_prompt"):
        lines.append(f"long prompt ({long['prompt_tokens']} tokens, articles to summarise), first token s / tokens/s "
                     "after it: " + "; ".join(f"{name} {long[name]['first_token_seconds']:.1f} / "
                                              f"{long[name]['tokens_per_s_after_first']}"
                                              for name in long if isinstance(long[name], dict)))
    if restarted := result.get("restarted"):
        lines.append(f"after a restart, the same articles with another question ({restarted['prompt_tokens']} tokens): "
                     f"first token ours {restarted['ours_restarted_seconds']:.2f} s ({restarted['restored_tokens']} "
                     f"tokens restored from the caches saved at exit; afresh {restarted['ours_afresh_seconds']:.2f} s)")
    lines.append(f"verify cost, ms per target pass over n tokens: {result['verify_cost_ms']}; "
                 f"draft: {result['draft_cost_ms']}")
    lines.append(f"memory: target {memory['target_bytes'] / 2**30:.2f} GiB ({result['config']['precision']}), "
                 f"draft {memory['draft_bytes'] / 2**30:.2f} GiB ({result['config']['draft_precision']}), "
                 f"process RSS with both in use {memory['process_rss_in_use_bytes'] / 2**30:.2f} GiB"
                 + (f"; llama.cpp holding both (a process of its own, one context of {llama_peer.CONTEXT:,} tokens "
                    f"each) {memory['llama_cpp_rss_bytes'] / 2**30:.2f} GiB" if memory.get("llama_cpp_rss_bytes") else ""))
    if result["config"].get("peer"):
        lines.append(f"peer: {result['config']['peer']}")
    return "\n".join(lines)
