"""The low-bit models on a CPU the kernel cannot run on (lowbit/fallback): int8 through torch's
own matmul, chosen, said and measured."""
import json

import pytest
import torch

from app.engine.choices import Precision
from app.engine.engine import SpeculativeEngine
from app.engine.lowbit.fallback import Int8Linear, run_without_kernel
from app.engine.lowbit.modules import LowBitLinear, fuse_projections, quantize_model
from app.engine.models.decoder import cached
from app.engine.models.lean_decoder import LeanDecoder
from app.engine.models.loading import LoadedModel, load_model
from app.engine.sampling import SamplingParams
from tests.helpers import generated_ids
from tests.tiny import tiny_model


def low_bit(seed: int, without_kernel: bool) -> LoadedModel:
    tiny = tiny_model(seed=seed)
    model = quantize_model(tiny.model, 8)
    fuse_projections(model.model.layers)  # as the store keeps them
    if without_kernel:
        run_without_kernel(model)
    return LoadedModel(tiny.name, model, tiny.tokenizer, "lowbit")


def test_without_the_kernel_every_low_bit_linear_runs_as_int8_through_the_lean_decoder():
    kernel, fallback = low_bit(1, without_kernel=False), low_bit(1, without_kernel=True)
    assert not [m for m in fallback.model.modules() if isinstance(m, LowBitLinear)]
    fused = [m for layer in kernel.model.model.layers for m in (getattr(layer.self_attn, "fused_qkv", None),
                                                                 getattr(layer.mlp, "fused_gate_up", None)) if m]
    assert fused  # they went: their parts run on their own, the weights held once
    assert len([m for m in fallback.model.modules() if isinstance(m, Int8Linear)]) == \
        len([m for m in kernel.model.modules() if isinstance(m, LowBitLinear)]) - len(fused)
    assert isinstance(cached(fallback.model), LeanDecoder)
    tokens = torch.arange(3, 40) % 96
    ours, theirs = cached(fallback.model).forward(tokens, 4), cached(kernel.model).forward(tokens, 4)
    assert not torch.equal(ours, theirs)  # its own rounding (int8 weights, activations per row) ...
    assert (ours - theirs).norm() < 0.1 * theirs.norm()  # ... of the same weights
    assert fallback.memory_bytes < kernel.memory_bytes + sum(  # int8 weights beside the packed embedding
        m.in_features * m.out_features * 1.1 for m in fallback.model.modules() if isinstance(m, Int8Linear))


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8)])
def test_speculation_without_the_kernel_gives_the_int8_targets_own_output(sampling):
    target, draft = low_bit(1, without_kernel=True), low_bit(2, without_kernel=True)
    engine = SpeculativeEngine(target, draft)
    for prompt in ([1, 2, 3, 4, 5], [10, 11, 12, 10, 11, 12]):
        plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=40, sampling=sampling, seed=3)
        if sampling.greedy:
            assert generated_ids(engine, prompt, k=4, max_new_tokens=40, sampling=sampling) == plain
        else:  # the same seed need not give the same text; a text of the right length and vocabulary
            sampled = generated_ids(engine, prompt, k=4, max_new_tokens=40, sampling=sampling, seed=3)
            assert len(sampled) == 40 and all(0 <= i < 96 for i in sampled)


def test_a_load_on_a_cpu_without_the_kernel_says_what_runs_and_why(tmp_path, monkeypatch):
    """The kernel's absence injected where the loader asks for it (why_not_native)."""
    from app.engine.models import loading

    folder = tmp_path / "tiny"
    tiny = tiny_model(seed=1)
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    with_kernel = load_model(str(folder))
    assert with_kernel.label.startswith("8bit, ") and with_kernel.label.endswith(" kernel")
    turned_off = load_model(str(folder), kernel=False)
    assert turned_off.label == "8bit, int8 torch matmul: the kernel turned off for this load"
    monkeypatch.setattr(loading, "why_not_native", lambda: "this CPU has neither AVX-512 VNNI nor AVX2")
    arm = load_model(str(folder))
    assert arm.label == "8bit, int8 torch matmul: this CPU has neither AVX-512 VNNI nor AVX2"
    assert not [m for m in arm.model.modules() if isinstance(m, LowBitLinear)]


def test_the_memory_check_counts_the_int8_copy_where_the_kernel_cannot_run(tmp_path):
    from app.engine.memory_check import WITHOUT_KERNEL_PEAK, needed_bytes

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"\0" * 1000)
    assert needed_bytes(gguf, None, Precision.LOWBIT, prepared=True) == (1000, "at low bit")
    need, why = needed_bytes(gguf, None, Precision.LOWBIT, prepared=True, without_kernel=True)
    assert need == 1000 * WITHOUT_KERNEL_PEAK and "int8" in why


def test_bench_speed_measures_the_kernel_the_fallback_and_the_fp32_reference_in_one_run(tmp_path, monkeypatch):
    """`bench speed --cpu-paths` on a tiny pair of model folders: each path loads as it says, decodes
    the same prompts plain and speculative, and its speculative output equals its plain output."""
    from app.bench.cpu_paths import format_table, run_cpu_paths
    from app.cli import build_parser
    from tests.served import build_pair

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    target, draft = build_pair(tmp_path)
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": f"How do I install it, step {i}?"}) + "\n" for i in range(3)))
    args = build_parser().parse_args(
        ["bench", "speed", "--cpu-paths", "--target", str(target), "--draft", str(draft),
         "--draft-precision", "lowbit", "--data", str(data), "--limit", "2", "--max-new-tokens", "12",
         "--json", str(tmp_path / "paths.json")])
    result = run_cpu_paths(args)
    assert json.loads((tmp_path / "paths.json").read_text()) == result
    paths = result["paths"]
    assert list(paths) == ["kernel", "no kernel", "fp32 reference"]
    assert paths["kernel"]["target"].endswith(" kernel")
    assert paths["no kernel"]["target"] == "8bit, int8 torch matmul: the kernel turned off for this load"
    assert paths["fp32 reference"]["target"] == "fp32" and paths["fp32 reference"]["plain_vs_fp32_plain"] == 1.0
    for row in paths.values():
        assert row["identical"] and row["plain"]["tokens"] == row["speculative"]["tokens"] == 24
        assert row["plain"]["tokens_per_s"] > 0
    assert "| no kernel | 8bit, int8 torch matmul" in format_table(result)


def test_an_int8_rows_product_is_the_same_whatever_rows_share_its_call():
    """Batch invariance: a verification's rows each get what decoding them one by one gives (torch
    quantizes a call's activations with one scale; each row is framed to the same range)."""
    torch.manual_seed(0)
    tiny = tiny_model(seed=3, hidden=64)
    linear = quantize_model(tiny.model, 8).model.layers[0].mlp.down_proj
    int8 = Int8Linear(linear)
    rows = torch.randn(65, linear.in_features) * torch.rand(65, 1) * 20  # rows of very different sizes
    one_by_one = torch.cat([int8(row) for row in rows.split(1)])
    for width in (2, 5, 9, 33, 65):
        assert torch.equal(int8(rows[:width]), one_by_one[:width]), width
    exact = linear(rows)
    assert (one_by_one - exact).norm() < 0.02 * exact.norm()
