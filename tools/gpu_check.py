"""One run of the GPU path on tiny models built in code, printed as a table: what a machine with a
GPU checks in about three minutes (the default pair's 1.6 GB need not travel there).

    python tools/gpu_check.py                 # the GPU torch sees (CUDA, else an Apple GPU)
    python tools/gpu_check.py --device cpu    # a dry run of the same checks on the CPU, in float32

It covers the device and its dtype; a tiny pair loaded through the app's own loader, decoding plain
and speculative, greedy and sampled, with adaptive k and prompt lookup; rejection sampling's
two-token distribution against the target's; a follow-up that reuses the cache, a switch to
another chat and back, a read-ahead, saved caches round-tripped; a tiny GGUF loaded on the device
(the float copy labelled fp32, the CPU's low-bit copy kept); and the peak memory. Needs no model
file, and of the app's dependencies only those of its engine: torch, transformers, gguf, psutil
and platformdirs (no Qt). Exit status 1 when a check fails.

On a GPU greedy speculative output may part from plain output at a near-tie (a pass over several
tokens rounds otherwise than one over one): that is reported, not failed; on the CPU it fails.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the app, and its tests' tiny models

import torch  # noqa: E402

ROWS: list[dict] = []


def check(name: str):
    """Runs the decorated check now; its row says ok, FAIL (an assertion or an error) or its detail."""
    def run(function):
        start = time.perf_counter()
        try:
            detail, result = function(), "ok"
        except AssertionError as failure:
            detail, result = str(failure) or "assertion failed", "FAIL"
        except Exception as error:  # a crash is a failed check; the rest still run
            detail, result = f"{type(error).__name__}: {error}"[:300], "FAIL"
            traceback.print_exc()
        ROWS.append({"check": name, "result": result, "detail": detail or "",
                     "seconds": round(time.perf_counter() - start, 2)})
        print(f"{result:4} {name}: {detail}", flush=True)
        return function
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", help="cuda, mps or cpu (default: what the app picks)")
    parser.add_argument("--samples", type=int, default=1500, help="draws for the distribution check")
    parser.add_argument("--json", type=Path, help="write the table's rows here too")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="specchat-gpu-check-"))
    os.environ["SPECCHAT_CACHE"] = str(work / "cache")  # never the user's prepared copies
    if args.device:
        os.environ["SPECCHAT_DEVICE"] = args.device

    from app.chat.prompt import chat_prompt_ids
    from app.engine.devices import pick_device
    from app.engine.engine import SpeculativeEngine
    from app.engine.choices import GenerationOptions, ProposerKind, SamplingParams
    from app.engine.models.loading import load_model
    from tests.served import build_pair

    device, dtype, said = pick_device()
    on_gpu = device.type != "cpu"

    @check("device")
    def _():
        if device.type == "cuda":
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return f"{said}; cards: {', '.join(names)}; bf16 supported: {torch.cuda.is_bf16_supported()}"
        return said

    pair = []

    @check("the tiny pair loaded")
    def _():
        float_path = "lowbit" if on_gpu else "fp32"  # a GPU reads every model as float; the CPU's float path likewise
        pair.extend(load_model(str(folder), device, dtype, precision=float_path) for folder in build_pair(work))
        assert pair[0].model.device.type == device.type, pair[0].model.device
        return f"target {pair[0].label} on {pair[0].model.device}, draft {pair[1].label}"

    if not pair:  # nothing else can run
        print(table(ROWS))
        return 1
    target, draft = pair
    engine = SpeculativeEngine(target, draft)
    tokenizer = target.tokenizer
    ask = lambda text: chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
    prompt = ask("How do I install the app and run the tests?")

    def tokens(prompt_ids, **options):
        steps = list(engine.generate(prompt_ids, GenerationOptions(max_new_tokens=48, **options)))
        return [t.id for s in steps for t in s.tokens], steps

    plain, answer = [], []

    @check("plain decoding, greedy")
    def _():
        plain.extend(tokens(prompt, speculative=False)[0])
        return f"{len(plain)} tokens"

    def same_as_plain(ids: list[int], steps) -> str:
        stats = steps[-1].stats
        summary = f"{len(ids)} tokens, acceptance {stats.acceptance_rate:.0%}, {stats.target_passes} target passes"
        if ids == plain:
            return summary + ", identical to plain"
        first = next((i for i, (a, b) in enumerate(zip(ids, plain)) if a != b), min(len(ids), len(plain)))
        assert on_gpu, f"differs from plain decoding at token {first} on the CPU"
        return summary + f", parts from plain at token {first} (GPU rounding at a near-tie)"

    for name, options in [("greedy, speculative, k=4", {"k": 4, "adaptive": False}),
                          ("greedy, speculative, adaptive k", {"adaptive": True}),
                          ("greedy, prompt lookup", {"proposer": ProposerKind.PROMPT_LOOKUP})]:
        check(name)(lambda options=options: same_as_plain(*tokens(prompt, **options)))

    @check("sampled, speculative, temperature 0.8")
    def _():
        # a constant k: adaptive k follows the measured costs, and another k draws other numbers
        sampled = {"sampling": SamplingParams(temperature=0.8, top_p=0.95), "seed": 7, "k": 4, "adaptive": False}
        ids, steps = tokens(prompt, **sampled)
        again, _ = tokens(prompt, **sampled)
        assert len(ids) == 48 and ids == again, "the same seed gave another text"
        return f"48 tokens, acceptance {steps[-1].stats.acceptance_rate:.0%}, the same text for the same seed"

    @check("rejection sampling keeps the target's distribution")
    def _():
        return distribution(device, dtype, args.samples)

    def cached_first_step(prompt_ids) -> int:
        steps = engine.generate(prompt_ids, GenerationOptions(max_new_tokens=4))
        first = next(step for step in steps if step.tokens or step.finish)
        steps.close()
        return first.stats.cached_prompt_tokens

    @check("a follow-up reuses the cache")
    def _():
        answer.extend(tokens(prompt)[0])
        cached = cached_first_step(prompt + answer + ask("And then?"))
        assert cached >= len(prompt), f"only {cached} of {len(prompt) + len(answer)} tokens found in the cache"
        return f"{cached} prompt tokens found in the cache"

    @check("another chat, and back")
    def _():
        tokens(ask("Something else entirely: what is a GGUF file?"))
        cached = cached_first_step(prompt + answer + ask("One more thing?"))
        assert cached >= len(prompt), f"only {cached} tokens kept for the first chat"
        return f"{cached} tokens of the first chat kept while the other ran"

    @check("read-ahead")
    def _():
        reading = ask("A message read while it is typed: how fast is speculative decoding here?")
        engine.read_ahead(reading, threading.Event())
        cached = cached_first_step(reading)
        assert cached == len(reading) - 1, f"{cached} of {len(reading) - 1} tokens read ahead"
        return f"{cached} tokens read before the message was sent"

    @check("saved caches round-trip")
    def _():
        engine.keep_saved_caches(work / "saved")
        try:
            engine.save_caches()
            engine.forget()
            cached = cached_first_step(prompt + answer + ask("And then?"))
        finally:
            engine.keep_saved_caches(None)
        assert cached > 0, "nothing restored from the saved caches"
        return f"{cached} tokens restored from the copies saved on disk"

    @check("a GGUF on this device keeps the CPU's copy")
    def _():
        return gguf_on_device(work, tokenizer, device, dtype)

    @check("peak memory")
    def _():
        if device.type == "cuda":
            return f"{torch.cuda.max_memory_allocated() / 2**20:.1f} MiB allocated at most"
        if device.type == "mps":
            return f"{torch.mps.driver_allocated_memory() / 2**20:.1f} MiB held by the driver"
        import psutil

        return f"process RSS {psutil.Process().memory_info().rss / 2**20:.0f} MiB (CPU)"

    print(table(ROWS))
    if args.json:
        args.json.write_text(json.dumps({"device": said, "rows": ROWS}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if any(row["result"] == "FAIL" for row in ROWS) else 0


def distribution(device: torch.device, dtype: torch.dtype, samples: int) -> str:
    """Two sampled tokens after a prompt, drawn with speculation from a vocabulary of 6, against
    the exact distribution from the target's own logits (as tests/test_distribution.py checks)."""
    from app.engine.engine import GenerationOptions, SpeculativeEngine
    from app.engine.sampling import SamplingParams
    from tests.tiny import tiny_model
    from tests.two_tokens import exact_two_token_distribution, noise

    vocab, prompt = 6, [1, 2, 3]
    pair = [tiny_model(seed=seed, vocab_size=vocab, hidden=16, layers=1, init_range=0.5) for seed in (11, 12)]
    for loaded in pair:
        loaded.model.to(device, dtype)
    target, draft = pair
    params = SamplingParams(temperature=0.8, top_p=0.95)
    expected = exact_two_token_distribution(target, params, prompt)
    engine = SpeculativeEngine(target, draft)
    counts = torch.zeros(vocab, vocab)
    for seed in random.Random(0).sample(range(2**62), samples):
        steps = engine.generate(prompt, GenerationOptions(k=2, adaptive=False, sampling=params, seed=seed,
                                                          max_new_tokens=3))
        t1, t2 = [t.id for step in steps for t in step.tokens][:2]
        counts[t1, t2] += 1
    tv, bound = 0.5 * (counts / samples - expected).abs().sum().item(), 2 * noise(expected, samples)
    assert tv < bound, f"total variation {tv:.3f} against a noise bound of {bound:.3f}"
    return f"total variation {tv:.3f} over {samples} draws (noise bound {bound:.3f})"


def gguf_on_device(work: Path, tokenizer, device: torch.device, dtype: torch.dtype) -> str:
    """A tiny Q8_0 GGUF with the pair's tokenizer: loaded at low bit on the CPU, then on the device
    (a GPU reads its float32 copy); both prepared copies stay, each labelled with what it holds."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    from app.engine.lowbit import gguf_writing
    from app.engine.models import prepared_copies
    from app.engine.models.loading import load_model

    vocab = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["vocab"]
    gguf_writing.write_tokenizer(work / "words.gguf", tokenizer)  # the tokenizer's entries, copied below
    rng = np.random.default_rng(0)
    weight = lambda name, shape: (quantize((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                           gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0)
    norm = lambda n: (1 + 0.3 * rng.standard_normal(n)).astype(np.float32)
    shape = gguf_writing.Shape(2, 64, 128, 4, 2, 16, len(vocab) + 2, rope_base=10000.0, context=256)
    path = work / "tiny.gguf"
    gguf_writing.write(path, "qwen2", shape, weight, norm, tied=False, tokenizer_from=work / "words.gguf")
    on_cpu = load_model(str(path))  # the CPU's low-bit copy
    # the pickers' low-bit choice, on a GPU; the CPU's float path in a dry run
    here = load_model(str(path), device, dtype, precision="lowbit" if device.type != "cpu" else "fp32")
    labels = sorted(copy.precision for copy in prepared_copies.copies())
    assert labels == ["fp32", "lowbit"], f"prepared copies left: {labels}"
    expected = str(dtype).replace("torch.", "") if device.type != "cpu" else "fp32"
    assert here.precision == expected, f"loaded as {here.precision}, expected {expected}"
    return f"CPU {on_cpu.label}; on {device.type}: {here.label}; copies kept: {', '.join(labels)}"


def table(rows: list[dict]) -> str:
    lines = ["| check | result | detail | seconds |", "|---|---|---|---:|"]
    lines += [f"| {r['check']} | {r['result']} | {r['detail']} | {r['seconds']} |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
