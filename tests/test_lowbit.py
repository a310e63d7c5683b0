"""The low-bit engine: packing, GGUF block decoding, the C++ kernel against the pure-torch
reference, batch invariance, and greedy equivalence with low-bit tiny models."""
import os

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

from app.engine.engine import SpeculativeEngine
from app.engine.lowbit import kernel, packing
from app.engine.lowbit.gguf_weights import IQ4_VALUES, packed_from_gguf
from app.engine.lowbit.modules import LowBitLinear, quantize_model
from app.engine.errors import ModelError
from app.engine.models.loading import LoadedModel, Precision, load_model
from tests.helpers import all_steps, generated_ids
from tests.tiny import tiny_model, wide_low_bit

# bits, group, coded (int8 codes times float16 steps; else float16 per group, as GGUF's Q4_0, Q4_1,
# Q5_0, Q5_1 and Q8_0), symmetric (no min: w = scale * (q - 2^(bits-1)), as Q3_K, Q6_K, Q4_0, Q5_0, Q8_0),
# mapped (4-bit integers stand for IQ4_NL's 16 values: as IQ4_NL plain, IQ4_XS coded)
FORMATS = [(4, 32, True, False, False), (8, 32, False, False, False), (8, 16, False, False, False),
           (4, 16, True, False, False), (6, 16, True, True, False), (6, 32, True, True, False), (5, 32, True, False, False),
           (4, 32, False, False, False), (5, 32, False, False, False), (4, 32, False, True, False),
           (5, 32, False, True, False), (8, 32, False, True, False), (8, 16, False, True, False),
           (4, 32, False, True, True), (4, 32, True, True, True), (3, 32, True, False, False), (2, 16, True, False, False),
           (3, 16, True, True, False)]
FORMAT_NAMES = ("bits", "group", "coded", "symmetric", "mapped")


def quantized(weight: torch.Tensor, bits, group, coded, symmetric, mapped) -> packing.PackedWeight:
    return packing.quantize_float(weight, bits, group, coded, symmetric, IQ4_VALUES if mapped else None)


def random_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(FORMAT_NAMES, FORMATS)
def test_pack_round_trip(bits, group, coded, symmetric, mapped):
    q = torch.randint(0, 1 << bits, (48, 64), dtype=torch.uint8)  # 48 rows: padded to 64
    per_input = lambda t: t.repeat_interleave(64 // t.shape[1], 1)
    if coded:  # int8 codes per group times a float16 step per super-block
        scale, min_ = torch.randint(0, 128, (48, 64 // group)), torch.randint(-127, 128, (48, 64 // group))
        steps = torch.rand(48, 1), torch.rand(48, 1)
        scale_value, min_value = scale * steps[0].half().float(), min_ * steps[1].half().float()
    else:
        scale, min_ = torch.rand(48, 64 // group), torch.rand(48, 64 // group)
        steps, scale_value, min_value = (None, None), scale.half().float(), min_.half().float()
    value_bits = 8 if mapped else bits
    if symmetric:  # w = scale * (value - 2^(value bits - 1)), no min stored
        min_, steps, min_value = None, (steps[0], None), 2 ** (value_bits - 1) * scale_value
    packed = packing.pack(q, scale, min_, bits, group, *steps, values=IQ4_VALUES if mapped else None)
    assert packed.out_features == 64 and (packed.coded, packed.symmetric, packed.mapped) == (coded, symmetric, mapped)
    assert torch.equal(packing.unpack(packed)[:48], q)
    values = IQ4_VALUES[q.long()].float() if mapped else q.float()
    assert torch.equal(packing.dequantize(packed)[:48], per_input(scale_value) * values - per_input(min_value))


@pytest.mark.parametrize(FORMAT_NAMES, FORMATS)
def test_quantized_groups_cover_their_values(bits, group, coded, symmetric, mapped):
    """Scales and mins (codes or float16) are rounded outwards: no weight is clipped, every one
    is within half a step of its float value (mapped: half the widest gap between two values)."""
    weight = random_weight(64, 768) * torch.logspace(-3, 0, 768)  # groups of very different ranges
    packed = quantized(weight, bits, group, coded, symmetric, mapped)
    scale, _ = packing.group_params(packed)
    error = (packing.dequantize(packed) - weight).abs().view(64, -1, group).amax(dim=-1)
    step = IQ4_VALUES.diff().max() if mapped else 1
    assert (error <= scale * step * 0.5 * (1 + 1e-3) + 1e-7).all()


def test_pack_refuses_values_that_do_not_fit():
    with pytest.raises(ValueError, match="4 unsigned bits"):
        packing.pack(torch.full((32, 32), 16), torch.ones(32, 1), torch.zeros(32, 1), 4, 32, torch.ones(32, 1), torch.ones(32, 1))
    with pytest.raises(ValueError, match="6-bit weights need steps"):
        packing.pack(torch.zeros(32, 32), torch.ones(32, 2), None, 6, 16)
    with pytest.raises(ValueError, match="8-bit weights have no steps"):
        packing.pack(torch.zeros(32, 32), torch.ones(32, 1), torch.zeros(32, 1), 8, 32, torch.ones(32, 1), torch.ones(32, 1))
    with pytest.raises(ValueError, match="in 4 bits with groups of 16 and float16 scales"):
        packing.pack(torch.zeros(32, 32), torch.ones(32, 2), torch.zeros(32, 2), 4, 16)
    with pytest.raises(ValueError, match="codes must lie within"):
        packing.pack(torch.zeros(32, 32), torch.full((32, 1), 128), torch.zeros(32, 1), 4, 32, torch.ones(32, 1), torch.ones(32, 1))
    with pytest.raises(ValueError, match="6-bit weights have no min"):
        packing.pack(torch.zeros(32, 32), torch.ones(32, 1), torch.zeros(32, 1), 6, 32)
    with pytest.raises(ValueError, match="in 5 bits with groups of 16"):
        packing.pack(torch.zeros(32, 32), torch.ones(32, 2), torch.zeros(32, 2), 5, 16, torch.ones(32, 1), torch.ones(32, 1))


BUILDS = ["avx512", "avx2", "vnni256"]  # vnni256: the AVX-VNNI kernel, runnable on AVX-512 CPUs
OTHER_BUILDS = BUILDS[1:]


def built(isa: str):
    """The kernel module built for `isa` (one of BUILDS); skips where this CPU lacks it."""
    module = kernel.build(isa)
    if module is None:
        pytest.skip(f"this CPU cannot run the {isa} build")
    return module


def built_linear(isa: str):
    """The linear layer of the kernel built for `isa`: x, packed -> [M, N]."""
    module = built(isa)
    return lambda x, packed: module.linear(x, *packed.tensors().values(), packed.group, packed.bits)


@pytest.mark.parametrize(FORMAT_NAMES, FORMATS)
@pytest.mark.parametrize("isa", BUILDS)
def test_native_kernel_matches_reference(bits, group, coded, symmetric, mapped, isa):
    linear = built_linear(isa)
    packed = quantized(random_weight(96, 256), bits, group, coded, symmetric, mapped)
    # many batches: one activation rounded differently (a tie, a different division) would show
    for seed in range(30):
        x = random_weight(11, 256, seed=100 + seed)
        assert torch.allclose(linear(x, packed), packing.reference_linear(x, packed), rtol=1e-5, atol=1e-4)
    out = linear(x, packed)
    # and both are close to the float product (activation rounding only)
    exact = x @ packing.dequantize(packed).T
    assert (out - exact).abs().max() < 0.05 * exact.abs().max()


@pytest.mark.parametrize(FORMAT_NAMES, FORMATS)
@pytest.mark.parametrize("isa", OTHER_BUILDS)
def test_every_build_gives_the_avx512_bits(bits, group, coded, symmetric, mapped, isa):
    """Every build runs the same integer products and float steps: bit-identical outputs, also at
    the extremes where AVX2's 16-bit pair sums would saturate (8-bit weights of 255 against
    activations of +-127, taken there as w - 128)."""
    avx512, other = built_linear("avx512"), built_linear(isa)
    weight = random_weight(64, 256, seed=4)
    weight[:32, :128] = torch.where(weight[:32, :128] > 0, 1.0, -1.0)  # groups of two values: q = 0 or the top
    packed = quantized(weight, bits, group, coded, symmetric, mapped)
    if bits == 8:
        assert (packing.unpack(packed) == 255).sum() > 1000
    x = random_weight(11, 256, seed=5)
    x[:, :128] = torch.where(x[:, :128] > 0, 1.0, -1.0)  # quantized to +-127
    for rows in (1, 2, 3, 11):
        assert torch.equal(other(x[:rows], packed), avx512(x[:rows], packed))


BUILD_STARTS = """
import sys, threading
from app.engine.lowbit import kernel
threading.Thread.start = lambda thread: print(thread.name, "setuptools" in sys.modules)
kernel.build_in_background()
"""


def test_the_builders_imports_come_before_the_background_build():
    """torch's builder imports setuptools, which adds a finder to sys.meta_path for one import and
    takes it out again: another thread importing meanwhile could miss a module that is installed.
    So it is imported on the caller's thread, before the build's starts."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", BUILD_STARTS], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "specchat-kernel-build True", done.stderr


def test_the_build_follows_the_cpu(monkeypatch):
    """AMD's cores prefetch the weights as non-temporal data; Intel's stall on it (see kernel.cpp's
    kFirstPassLocality), as may others'. A build with other flags is another build (its own folder)."""
    fields = {"vendor_id": "AuthenticAMD"}
    monkeypatch.setattr(kernel, "cpu_field", lambda name: fields.get(name, ""))
    amd = kernel.compile_flags("avx512")
    assert "-DSPECCHAT_PREFETCH_NTA" in amd and "-DSPECCHAT_PREFETCH_NTA" not in kernel.compile_flags("avx2")
    fields["vendor_id"] = "GenuineIntel"
    assert "-DSPECCHAT_PREFETCH_NTA" not in kernel.compile_flags("avx512")
    try:
        kernel._source_digest.cache_clear()
        intel_digest = kernel._source_digest("avx512")
        fields["vendor_id"] = "AuthenticAMD"
        kernel._source_digest.cache_clear()
        assert kernel._source_digest("avx512") != intel_digest
    finally:
        kernel._source_digest.cache_clear()  # the real machine's, from here on


@pytest.mark.parametrize(FORMAT_NAMES, FORMATS)
@pytest.mark.parametrize("path", [*BUILDS, "reference"])
def test_linear_is_batch_invariant(bits, group, coded, symmetric, mapped, path):
    """A row gives bit-identical outputs alone and inside batches of any size."""
    linear = packing.reference_linear if path == "reference" else built_linear(path)
    packed = quantized(random_weight(64, 128, seed=3), bits, group, coded, symmetric, mapped)
    x = torch.randn(17, 128) * torch.logspace(-2, 2, 17)[:, None]  # rows of very different scales
    alone = torch.cat([linear(x[i : i + 1], packed) for i in range(17)])
    # AVX-512: up to 7 rows each tile alone, from 8 rows the pair, in blocks of 3 to 5 rows
    for size in (2, 5, 6, 7, 8, 9, 16, 17):
        assert torch.equal(torch.cat([linear(x[i : i + size], packed) for i in range(0, 17, size)]), alone)


@pytest.mark.parametrize(FORMAT_NAMES, FORMATS)
def test_embedding_rows_match_the_dequantized_weight(bits, group, coded, symmetric, mapped):
    packed = quantized(random_weight(80, 64), bits, group, coded, symmetric, mapped)
    for ids in (torch.tensor([0, 5, 17, 79, 5]), torch.tensor([5])):  # one id: a single tile of 16 rows
        expected = packing.dequantize(packed)[ids]
        assert torch.equal(kernel.rows(ids, packed), expected)
        assert torch.equal(kernel.dequantize_rows(ids, packed), expected)


def random_blocks(qtype: GGMLQuantizationType, n_blocks: int, seed: int) -> np.ndarray:
    """Random bytes are valid blocks once their float16 scales are set to finite values."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    halves = {GGMLQuantizationType.Q6_K: [208], GGMLQuantizationType.Q4_K: [0, 2], GGMLQuantizationType.Q5_K: [0, 2],
              GGMLQuantizationType.Q4_1: [0, 2], GGMLQuantizationType.Q5_1: [0, 2],
              GGMLQuantizationType.Q2_K: [80, 82], GGMLQuantizationType.Q3_K: [108], GGMLQuantizationType.IQ4_XS: [0]}
    for offset in halves.get(qtype, [0]):
        blocks[:, offset : offset + 2] = rng.uniform(0.001, 0.1, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS"])
def test_gguf_blocks_repack_to_the_same_weights(qtype):
    qtype = GGMLQuantizationType[qtype]
    block_size = GGML_QUANT_SIZES[qtype][0]
    n, k = 32, 512
    data = random_blocks(qtype, n * k // block_size, seed=7).reshape(n, -1)
    packed = packed_from_gguf(data, qtype, (n, k))
    expected = torch.from_numpy(dequantize(data, qtype).reshape(n, k).astype(np.float32))
    # the block's own integers, codes and float16 steps: exact
    assert torch.equal(packing.dequantize(packed), expected)
    # about the GGUF's size: Q4_0, Q4_1, Q5_0, Q5_1, Q6_K and Q8_0 exactly, Q4_K 4.625 bits per
    # weight against 4.5 and Q5_K 5.625 against 5.5 (the kernel reads int8 codes where the K-quants
    # pack 6 bits); Q2_K 2.625 bits as 3.125 and Q3_K 3.4375 as 3.5625 (the same int8 codes)
    extra = {"Q2_K": 3.125 / 2.625, "Q3_K": 3.5625 / 3.4375}.get(qtype.name, 1.03)
    assert packed.nbytes <= data.nbytes * extra


def test_gguf_rows_follow_the_architecture_order():
    qtype = GGMLQuantizationType.Q8_0
    data = random_blocks(qtype, 32 * 64 // 32, seed=1).reshape(32, -1)
    order = np.arange(32)[::-1].copy()
    straight = packing.dequantize(packed_from_gguf(data, qtype, (32, 64)))
    assert torch.equal(packing.dequantize(packed_from_gguf(data, qtype, (32, 64), order)), straight.flip(0))


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_gguf_weights_quantized_afresh_a_few_rows_at_a_time_equal_the_whole(bits, monkeypatch):
    """A GGUF matrix re-quantized (a cheaper draft, or a format the kernel does not take) goes some
    rows at a time, to bound a first start's memory: the same packed weight as the whole at once,
    rows in the architecture's order and the last part padded included."""
    from app.engine.lowbit import gguf_weights

    qtype = GGMLQuantizationType.Q8_0
    n, k = 100, 64
    data = random_blocks(qtype, n * k // 32, seed=3).reshape(n, -1)
    order = np.random.default_rng(0).permutation(n)
    whole = torch.from_numpy(dequantize(data, qtype).reshape(n, k).astype(np.float32))[torch.from_numpy(order)]
    expected = packing.quantize_float(whole, bits, 32)
    monkeypatch.setattr(gguf_weights, "REQUANTIZED_ROWS", 32)
    chunked = packed_from_gguf(data, qtype, (n, k), order, requantize_bits=bits)
    assert all(torch.equal(getattr(chunked, name), getattr(expected, name)) for name in packing.PackedWeight.TENSORS)
    assert chunked.out_features == expected.out_features == 128 and chunked.bits == bits


def write_tiny_gguf(path, architecture, layers=2, width=64, inner=128, heads=4, kv_heads=2, head_dim=16,
                    vocabulary=96, extra=None, tied=False, **settings):
    """A GGUF in Q8_0 whose heads are narrower than the architecture's usual ones; returns each
    layer's norms as the file stores them ({GGUF name: float32 array})."""
    from gguf.quants import quantize

    from app.engine.lowbit import gguf_writing

    rng = np.random.default_rng(0)
    weight = lambda name, shape: (quantize((rng.standard_normal(shape) * 0.2).astype(np.float32), GGMLQuantizationType.Q8_0),
                            GGMLQuantizationType.Q8_0)
    norms = []
    norm = lambda n: norms.append((1 + 0.3 * rng.standard_normal(n)).astype(np.float32)) or norms[-1]
    shape = gguf_writing.Shape(layers, width, inner, heads, kv_heads, head_dim, vocabulary, rope_base=10000.0,
                               context=256, **settings)
    gguf_writing.write(path, architecture, shape, weight, norm, tied=tied, extra=extra)
    extra_norms = gguf_writing.EXTRA_NORMS.get(architecture, ())
    per_layer, names = 2 + len(extra_norms), ["attn_norm", "ffn_norm", *extra_norms]
    return [dict(zip(names, norms[1 + i * per_layer: 1 + (i + 1) * per_layer])) for i in range(layers)]


@pytest.mark.parametrize("architecture", ["qwen3", "gemma2", "gemma3"])
def test_a_qwen3_or_gemma_gguf_loads_low_bit_and_runs_lean(tmp_path, architecture):
    """A Qwen3, Gemma 2 or Gemma 3 GGUF's blocks load as they are, with the file's width per head
    (transformers' reading keeps Qwen3's default of 128 and Gemma's of 256) and its head norms,
    and the stored copy runs through the lean decoder as transformers' forward computes it. Gemma:
    its norms as 1 + the weight (the file stores the sum), its embeddings scaled by the width's
    square root, queries scaled by the head width as llama.cpp reads the file, and a sliding
    window of 8 on its local layer; Gemma 3: the global layers' linear rotary scaling; Gemma 2:
    the file's soft caps."""
    from app.engine.models import lean_decoder
    from app.engine.models.transformers_decoder import TransformersDecoder
    from app.engine.models.decoder import cached
    from app.engine.lowbit import skeleton, prepared_tensors as store
    from app.engine.lowbit.loader import load_gguf_lowbit
    from app.engine.lowbit.modules import LowBitEmbedding

    gemma = architecture.startswith("gemma")
    settings = {"gemma3": {"sliding_window": 8, "rope_linear_factor": 8.0},
                "gemma2": {"sliding_window": 8, "soft_caps": (1.5, 2.5)}}.get(architecture, {})
    norms = write_tiny_gguf(tmp_path / "tiny.gguf", architecture, tied=gemma, **settings)  # as Gemma's files are
    model = load_gguf_lowbit(tmp_path / "tiny.gguf")
    model_type = {"gemma3": "gemma3_text"}.get(architecture, architecture)
    assert model.config.model_type == model_type and model.config.head_dim == 16
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    offset = 1.0 if gemma else 0.0
    for layer, stored in zip(model.model.layers, norms):
        assert torch.equal(layer.post_attention_layernorm.weight, torch.from_numpy(stored["ffn_norm" if not gemma else "post_attention_norm"]) - offset)
        if architecture != "gemma2":
            assert torch.equal(layer.self_attn.q_norm.weight, torch.from_numpy(stored["attn_q_norm"]) - offset)
            assert torch.equal(layer.self_attn.k_norm.weight, torch.from_numpy(stored["attn_k_norm"]) - offset)
    if gemma:
        assert model.config.query_pre_attn_scalar == 16 and model.config.sliding_window == 8
        assert torch.equal(model.model.layers[0].post_feedforward_layernorm.weight,
                           torch.from_numpy(norms[0]["post_ffw_norm"]) - 1)
    if architecture == "gemma3":
        assert isinstance(model.model.embed_tokens, LowBitEmbedding) and model.model.embed_tokens.scalar_embed_scale == 8.0
        assert model.config.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0}
    if architecture == "gemma2":
        assert (model.config.attn_logit_softcapping, model.config.final_logit_softcapping) == (1.5, 2.5)
    store.save(model, tiny_model(1).tokenizer, tmp_path / "stored")
    loaded, _ = store.load(tmp_path / "stored")
    assert isinstance(loaded, skeleton.CausalLM)
    ours, reference = cached(loaded, cache_dtype=torch.float32), TransformersDecoder(model)
    assert isinstance(ours, lean_decoder.LeanDecoder)
    for tokens, keep in ((torch.arange(3, 40) % 96, 1), (torch.tensor([5, 17, 29, 41]), 4)):
        assert torch.allclose(ours.forward(tokens, keep), reference.forward(tokens, keep), atol=1e-4, rtol=1e-4)


def test_a_llama3_gguf_keeps_its_rotary_scaling(tmp_path):
    """llama.cpp's files carry Llama 3.1 and later's rotary scaling as a divisor per frequency
    (rope_freqs), which transformers' reading drops: the low-bit model, its stored copy and the
    fp32 reference's folder all take it, giving the frequencies of the original model's llama3
    scaling."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from app.engine.models.transformers_decoder import TransformersDecoder
    from app.engine.models.decoder import cached
    from app.engine.lowbit import prepared_tensors as store
    from app.engine.lowbit.loader import load_gguf_lowbit

    original = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=256,
                           rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64})
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](original, torch.device("cpu"))
    plain = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float) / 16))
    assert not torch.allclose(plain, scaled)  # the scaling changes some frequencies ...
    write_tiny_gguf(tmp_path / "tiny.gguf", "llama", extra={"rope_freqs.weight": (plain / scaled).numpy()})
    model = load_gguf_lowbit(tmp_path / "tiny.gguf")
    assert torch.allclose(model.model.rotary_emb.inv_freq, scaled, rtol=1e-6)  # ... and the file's are those
    store.save(model, tiny_model(1).tokenizer, tmp_path / "stored")
    loaded, _ = store.load(tmp_path / "stored")
    assert torch.equal(loaded.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
    ours, reference = cached(loaded, cache_dtype=torch.float32), TransformersDecoder(model)
    tokens = torch.arange(3, 90) % 96  # past the scaling's 64 positions
    assert torch.allclose(ours.forward(tokens, 1), reference.forward(tokens, 1), atol=1e-4, rtol=1e-4)
    # the fp32 reference: a GGUF is dequantized into a folder whose config carries the divisors
    from transformers import LlamaForCausalLM

    folder_config = LlamaConfig(**{**model.config.to_dict(), "architectures": None})
    LlamaForCausalLM(folder_config).save_pretrained(tmp_path / "fp32")
    tiny_model(1).tokenizer.save_pretrained(tmp_path / "fp32")
    fp32 = load_model(str(tmp_path / "fp32"), precision=Precision.FP32)
    assert torch.equal(fp32.model.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)


def low_bit_copy(model: LoadedModel, bits: int) -> LoadedModel:
    copy = tiny_model(seed=int(model.name.split("-")[1]))  # same weights, a fresh float copy
    return LoadedModel(f"{model.name}-q{bits}", quantize_model(copy.model, bits), copy.tokenizer)


@pytest.fixture(scope="module")
def low_bit_target(tiny_target):
    return low_bit_copy(tiny_target, 8)


def test_a_stored_model_starts_without_transformers_modeling_code(tmp_path):
    """A later start of a lean-run model (the default pair's) imports the app and loads and runs the
    stored copy without transformers' modeling code, which takes seconds to import."""
    import subprocess
    import sys
    import textwrap

    from app.engine.lowbit import prepared_tensors as store
    from app.engine.lowbit.loader import load_gguf_lowbit

    write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2")
    store.save(load_gguf_lowbit(tmp_path / "tiny.gguf"), tiny_model(1).tokenizer, tmp_path / "stored")
    script = textwrap.dedent(f"""
        import sys, torch
        from pathlib import Path
        import app.cli, app.ui.main_window
        from app.engine.models.decoder import cached
        from app.engine.lowbit import prepared_tensors as store
        model, tokenizer = store.load(Path({str(tmp_path / "stored")!r}))
        logits = cached(model).forward(torch.tensor([3, 5, 7]), 1)
        assert logits.shape[-1] == 96 and len(tokenizer) > 0
        print(sorted(name for name in sys.modules if name.startswith("transformers.modeling_utils")))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_quantized_model_keeps_only_low_bit_linears(low_bit_target, tiny_target):
    linears = [m for m in low_bit_target.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == []
    assert any(isinstance(m, LowBitLinear) for m in low_bit_target.model.modules())
    assert low_bit_target.memory_bytes < 0.45 * tiny_target.memory_bytes


@pytest.mark.parametrize("k", [1, 3, 8])
def test_low_bit_greedy_equivalence_with_an_unrelated_draft(low_bit_target, tiny_draft, k):
    draft = low_bit_copy(tiny_draft, 4)
    engine = SpeculativeEngine(low_bit_target, draft)
    prompt = [5, 9, 2, 7]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=40)
    assert generated_ids(engine, prompt, k=k, max_new_tokens=40) == plain


def test_low_bit_greedy_equivalence_without_the_native_kernel(monkeypatch):
    """The pure-torch path (no compiler, or a CPU the kernel cannot run on) decodes, one token at
    a time included (an embedding lookup within one tile of 16 rows, over two groups), and
    speculation keeps its output."""
    monkeypatch.setattr(kernel, "native", lambda: None)
    engine = SpeculativeEngine(wide_low_bit(5, 8), wide_low_bit(6, 4))
    prompt = [5, 9, 2, 7]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=12)
    assert len(plain) == 12 and generated_ids(engine, prompt, k=3, max_new_tokens=12) == plain


@pytest.mark.parametrize("isa", OTHER_BUILDS)
def test_low_bit_greedy_equivalence_with_the_other_builds(isa, monkeypatch):
    """On a CPU without AVX-512 another build runs the layer stack: speculation keeps the output
    there too."""
    from app.engine.models import lean_decoder

    module = built(isa)
    monkeypatch.setattr(kernel, "native", lambda: module)
    target, draft = wide_low_bit(5, 8), wide_low_bit(6, 4)
    assert lean_decoder.native_stack(target.model) is not None
    engine = SpeculativeEngine(target, draft)
    prompt = [5, 9, 2, 7]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=30)
    for k in (1, 4):
        assert generated_ids(engine, prompt, k=k, max_new_tokens=30) == plain


@pytest.mark.parametrize("architecture", ["qwen3", "gemma2", "gemma3"])
def test_low_bit_qwen3_and_gemma_run_lean_and_keep_the_output(architecture):
    """Qwen3 (the q/k head norms), Gemma 3 (also output norms, a sliding window shorter than the
    answer) and Gemma 2 (no head norms, soft caps) run through the lean decoder and, where the
    kernel is built, its C++ layer stack: speculation gives the target's greedy output."""
    from app.engine.models import lean_decoder
    from app.engine.models.decoder import cached

    target = quantize_model(tiny_model(seed=5, hidden=64, architecture=architecture).model, 8)
    draft = quantize_model(tiny_model(seed=6, hidden=64, architecture=architecture).model, 4, feed_forward_bits=3)
    decoder = cached(target)
    assert isinstance(decoder, lean_decoder.LeanDecoder) and decoder.head_norms == (architecture != "gemma2")
    assert (decoder.stack is not None) == (kernel.native() is not None)
    engine = SpeculativeEngine(LoadedModel("t", target, tiny_model(5).tokenizer), LoadedModel("d", draft, tiny_model(6).tokenizer))
    prompt = [5, 9, 2, 7]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=30)
    for k in (1, 4):
        assert generated_ids(engine, prompt, k=k, max_new_tokens=30) == plain


def test_low_bit_same_model_draft_accepts_everything(low_bit_target):
    engine = SpeculativeEngine(low_bit_target, low_bit_target)
    prompt = [3, 1, 4, 1, 5]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=36)
    steps = all_steps(engine, prompt, k=5, max_new_tokens=36)
    assert [t.id for s in steps for t in s.tokens] == plain
    # Only batch invariance makes this exact: each draft token was computed alone by the draft
    # (the same low-bit model) and is verified inside a batch of six by the target.
    assert steps[-1].stats.acceptance_rate == 1.0


def test_a_float_folder_loads_quantized_on_request(tmp_path, tiny_target, monkeypatch):
    from app.engine.models import prepared_copies as prepared

    monkeypatch.setattr(prepared, "folder", lambda: tmp_path / "prepared")  # (the kernel's build stays shared)
    tiny_target.model.save_pretrained(tmp_path / "m")
    tiny_target.tokenizer.save_pretrained(tmp_path / "m")
    fp32 = load_model(str(tmp_path / "m"), precision=Precision.FP32)
    four = load_model(str(tmp_path / "m"), precision=Precision.BITS4)
    assert four.precision.startswith("4bit") and fp32.precision == "fp32"
    assert four.memory_bytes < 0.3 * fp32.memory_bytes
    three = load_model(str(tmp_path / "m"), precision=Precision.BITS3)
    bits = {name: m.bits for name, m in three.model.named_modules() if isinstance(m, LowBitLinear)}
    assert {b for name, b in bits.items() if ".mlp." in name} == {3}
    assert {b for name, b in bits.items() if ".mlp." not in name} == {4}
    assert three.memory_bytes < four.memory_bytes


def _tied(tiny):
    """The tiny model with its output layer tied to its embedding, as small Qwen2.5 models are."""
    config = tiny.model.config.__class__.from_dict({**tiny.model.config.to_dict(), "tie_word_embeddings": True})
    model = type(tiny.model)(config).eval()
    model.load_state_dict({k: v for k, v in tiny.model.state_dict().items() if k != "lm_head.weight"}, strict=False)
    return model


@pytest.mark.parametrize("architecture,tied,dtype,bits,feed_forward_bits,rows", [
    ("qwen2", False, torch.bfloat16, 8, None, None), ("qwen2", True, torch.float16, 4, 3, 32),
    ("qwen3", False, torch.float32, 4, None, 64), ("gemma3", True, torch.bfloat16, 8, None, None)])
def test_a_float_folder_is_quantized_tensor_by_tensor_into_the_model_a_whole_read_gives(
        tmp_path, monkeypatch, architecture, tied, dtype, bits, feed_forward_bits, rows):
    """A model folder quantized one tensor at a time, a few rows at a time (never whole as float32
    in memory; rows: how many, where the tiny model's tensors have more) gives the very tensors and
    logits of the whole float32 read quantized by quantize_model."""
    from transformers import AutoModelForCausalLM

    from app.engine.lowbit import gguf_weights
    from app.engine.lowbit.folder_loader import load_folder_lowbit

    if rows:
        monkeypatch.setattr(gguf_weights, "REQUANTIZED_ROWS", rows)

    tiny = tiny_model(seed=4, hidden=64, architecture=architecture)
    model = _tied(tiny) if tied else tiny.model
    model.to(dtype).save_pretrained(tmp_path / "m")
    streamed = load_folder_lowbit(tmp_path / "m", bits, feed_forward_bits)
    whole = quantize_model(AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval(), bits,
                           feed_forward_bits=feed_forward_bits)
    ours, reference = streamed.state_dict(), whole.state_dict()
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in ours)
    assert (streamed.lm_head.w_q.data_ptr() == streamed.model.embed_tokens.w_q.data_ptr()) == tied  # packed once
    tokens = torch.tensor([[3, 17, 29, 41, 5, 60]])
    assert torch.equal(streamed(tokens).logits, whole(tokens).logits)


def test_a_float_folder_is_prepared_once_and_a_checkpoint_that_does_not_map_is_read_whole(tmp_path, monkeypatch):
    """The first start writes the quantized copy and later ones read it; a checkpoint whose
    tensors are not the model's parameters one to one (here a stray tensor) is read whole as
    float32 instead, to the same model."""
    from safetensors.torch import load_file, save_file

    from app.engine.models import prepared_copies as prepared
    from app.engine.lowbit import folder_loader

    monkeypatch.setattr(prepared, "folder", lambda: tmp_path / "prepared")
    tiny = tiny_model(seed=5, hidden=64)
    tiny.model.to(torch.bfloat16).save_pretrained(tmp_path / "m")
    tiny.tokenizer.save_pretrained(tmp_path / "m")
    prompt = [4, 8, 15, 16, 23]
    first = load_model(str(tmp_path / "m"))
    assert first.precision.startswith("8bit")  # not "lowbit": a float model has no blocks of its own
    expected = generated_ids(SpeculativeEngine(first), prompt, speculative=False, max_new_tokens=12)
    (copy,) = prepared.copies()
    assert copy.source == str((tmp_path / "m").resolve()) and copy.precision == "lowbit"
    monkeypatch.setattr(folder_loader, "load_folder_lowbit", lambda *_, **__: pytest.fail("quantized again"))
    again = load_model(str(tmp_path / "m"))
    assert generated_ids(SpeculativeEngine(again), prompt, speculative=False, max_new_tokens=12) == expected
    monkeypatch.undo()
    monkeypatch.setattr(prepared, "folder", lambda: tmp_path / "prepared")

    weights = load_file(tmp_path / "m" / "model.safetensors")
    save_file({**weights, "model.stray.weight": torch.ones(2)}, tmp_path / "m" / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(folder_loader.NotStreamable, match="model.stray.weight is no parameter"):
        folder_loader.load_folder_lowbit(tmp_path / "m", 8)
    changed = load_model(str(tmp_path / "m"))  # a changed file: a new copy, read whole, the same model
    assert generated_ids(SpeculativeEngine(changed), prompt, speculative=False, max_new_tokens=12) == expected
    assert [c.path for c in prepared.copies()] != [copy.path] and len(prepared.copies()) == 1


def test_a_hub_id_in_the_local_cache_is_prepared_once_as_its_folder_is(tmp_path, monkeypatch):
    """A hub id whose files are in the local Hugging Face cache loads from its snapshot folder: the
    same model as that folder, quantized on the first start into a copy noted by the hub id."""
    import shutil

    import huggingface_hub

    from app.engine.models import prepared_copies as prepared

    monkeypatch.setattr(prepared, "folder", lambda: tmp_path / "prepared")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--tiny--chat" / "snapshots" / "0123abcd"
    tiny = tiny_model(seed=6, hidden=64)
    tiny.model.to(torch.bfloat16).save_pretrained(snapshot)
    tiny.tokenizer.save_pretrained(snapshot)
    (tmp_path / "hub" / "models--tiny--chat" / "refs").mkdir()
    (tmp_path / "hub" / "models--tiny--chat" / "refs" / "main").write_text("0123abcd")
    prompt = [7, 3, 11, 19]
    by_id = load_model("tiny/chat")
    (copy,) = prepared.copies()
    assert copy.source == "tiny/chat" and copy.path.name.startswith("chat-") and not copy.source_missing
    by_folder = load_model(str(snapshot), precision=Precision.LOWBIT)
    assert generated_ids(SpeculativeEngine(by_id), prompt, speculative=False, max_new_tokens=10) == \
        generated_ids(SpeculativeEngine(by_folder), prompt, speculative=False, max_new_tokens=10)
    with pytest.raises(ModelError, match="no such hub id in the local Hugging Face cache"):
        load_model("tiny/not-cached")
    shutil.copytree(snapshot, snapshot.with_name("4567ef01"))  # a new revision replaces the old one's copy
    (tmp_path / "hub" / "models--tiny--chat" / "refs" / "main").write_text("4567ef01")
    load_model("tiny/chat")
    (newer,) = [c for c in prepared.copies() if c.source == "tiny/chat"]
    assert newer.path != copy.path and not copy.path.exists()


def test_a_draft_with_3_bit_feed_forward_layers_keeps_the_output():
    """The default draft's form (feed-forward layers in 3 bits, the rest in 4) through the layer
    stack: speculation still gives the target's greedy output."""
    from app.engine.models import lean_decoder

    target, draft = wide_low_bit(5, 8), wide_low_bit(6, 4, feed_forward_bits=3)
    assert lean_decoder.native_stack(draft.model) is not None or kernel.native() is None
    assert {m.bits for m in draft.model.model.layers[0].mlp.modules() if isinstance(m, LowBitLinear)} == {3}
    engine = SpeculativeEngine(target, draft)
    prompt = [5, 9, 2, 7]
    plain = generated_ids(engine, prompt, speculative=False, max_new_tokens=30)
    for k in (1, 4):
        assert generated_ids(engine, prompt, k=k, max_new_tokens=30) == plain


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3", "gemma2", "gemma3"])
@pytest.mark.parametrize("hidden", [32, 64])  # 64: q/k/v and gate/up fuse into one call each
def test_lean_decoder_matches_transformers_forward(hidden, architecture):
    """The lean pass runs the same modules as transformers' forward, cache, its growth and rollback
    included, over a context longer than the native attention's blocks of 64 keys (with a float32
    cache, as transformers' is; the float16 one is tested below). Qwen3 normalises each query and
    key head before the rotary embedding."""
    from app.engine.models.transformers_decoder import TransformersDecoder
    from app.engine.models.decoder import cached
    from app.engine.models.lean_decoder import LeanDecoder

    float_model = tiny_model(seed=5, hidden=hidden, architecture=architecture)
    with torch.no_grad():  # Qwen2's q/k/v biases start at zero; real models' do not
        for name, parameter in float_model.model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(generator=torch.Generator().manual_seed(len(name)))
    model = quantize_model(float_model.model, 8)
    lean, reference = cached(model, cache_dtype=torch.float32), TransformersDecoder(model)
    assert isinstance(lean, LeanDecoder)
    assert all(fused is not None for fused in lean.qkv + lean.gate_up) == (hidden == 64)
    for model in (lean, reference):
        model.forward(torch.arange(4, 150) % 96, keep=1)
    # the last step outgrows the cache's first 256 positions: the cache is copied into a larger one
    steps = [(torch.tensor([23, 42, 7]), 3), (torch.tensor([9]), 1), (torch.tensor([1, 2, 3, 4, 5, 6]), 6),
             (torch.arange(120) % 96, 2)]
    for tokens, keep in steps:
        lean_logits, reference_logits = lean.forward(tokens, keep), reference.forward(tokens, keep)
        assert torch.allclose(lean_logits, reference_logits, atol=1e-4, rtol=1e-4)
        for model in (lean, reference):
            model.rollback(model.length - 1)  # drop the last token, as a rejected draft


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("inner", [1, 17, 8960])
@pytest.mark.parametrize("isa", BUILDS)
def test_native_swiglu_matches_torch(inner, isa, gelu):
    """silu(gate) * up (Gemma: tanh GELU), 16 values at a time with a masked tail, over ordinary
    and extreme gates."""
    module = built(isa)
    torch.manual_seed(inner)
    gate = torch.randn(3, inner) * 4
    gate[0, :4] = torch.tensor([0.0, -100.0, 100.0, -1e4])[: min(4, inner)]
    up = torch.randn(3, inner)
    expected = (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up
    assert torch.allclose(module.swiglu(torch.cat([gate, up], dim=1), gelu), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("head_dim", [16, 80, 128])
@pytest.mark.parametrize("heads", [2, 6, 14])  # query heads per kv head: 1, 3, 7 (taken up to 4 at a time)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("isa", BUILDS)
# window 20: the rows' windows begin in one block of 64; 100: in another; cap: Gemma 2's soft cap
@pytest.mark.parametrize("window, cap", [(0, 0.0), (20, 0.0), (100, 0.0), (20, 1.5)])
def test_native_attention_matches_scaled_dot_product_attention(head_dim, heads, cache_dtype, isa, window, cap):
    """The layer stack's attention (keys in transposed blocks of 64, a kv head's query heads up to
    4 at a time, 64 components at a time, tails masked; a sliding window's keys only; scores
    soft-capped) against torch's, row by row, and bit-identical alone or in a batch; a float16
    cache is read as the float32 values it holds."""
    module = built(isa)
    kv_heads, start, n, capacity = 2, 150, 5, 192
    generator = torch.Generator().manual_seed(head_dim + heads)
    queries = torch.randn(n, heads, head_dim, generator=generator)
    cached_keys, cached_values = torch.randn(2, kv_heads, capacity, head_dim, generator=generator).to(cache_dtype)
    # keys whose scores would swamp the others' (outside the windows but for 130 in the widest):
    # a row must not take them into the maximum its exponentials are taken against
    cached_keys[0, [30, 130]] = (100 * queries[0, 0]).to(cache_dtype)
    keys, values = cached_keys.float(), cached_values.float()  # what the cache holds
    scale = head_dim**-0.5
    together = module.attention(queries, cached_keys, cached_values, start, scale, window, cap)
    for r in range(n):
        expected = reference_attention_row(queries[r], keys, values, start + r + 1, scale, window, cap)
        assert torch.allclose(together[r], expected, atol=1e-5, rtol=1e-4)
        alone = module.attention(queries[r : r + 1], cached_keys, cached_values, start + r, scale, window, cap)
        assert torch.equal(together[r], alone[0])


def reference_attention_row(query, keys, values, length, scale, window, cap=0.0):
    """torch's attention of one row (query [heads, head_dim]) over the first `length` cached keys
    and values ([kv_heads, capacity, head_dim]; with a window, its last `window` only) -> [heads, head_dim]."""
    group = query.shape[0] // keys.shape[0]
    seen = slice(max(0, length - window) if window else 0, length)
    scores = query[:, None] @ keys[:, seen].repeat_interleave(group, 0).transpose(1, 2) * scale  # [heads, 1, keys]
    if cap:
        scores = torch.tanh(scores / cap) * cap
    return (scores.softmax(-1) @ values[:, seen].repeat_interleave(group, 0))[:, 0]


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("window", [0, 100])
def test_rows_over_a_long_cache_go_in_passes_that_change_nothing(isa, window):
    """Over a long cache the rows' scores would outgrow the L2 cache, so the rows go in passes of a
    few (here 2, 2, 2 and 1): each row still gets torch's attention, bit-identical to the row alone."""
    module = built(isa)
    kv_heads, heads, head_dim, start, n = 2, 14, 16, 9000, 7  # 7 heads x 9,007 scores: 252 KB a row
    capacity = 9024
    generator = torch.Generator().manual_seed(window)
    queries = torch.randn(n, heads, head_dim, generator=generator)
    cached_keys, cached_values = torch.randn(2, kv_heads, capacity, head_dim, generator=generator).half()
    keys, values = cached_keys.float(), cached_values.float()
    scale = head_dim**-0.5
    together = module.attention(queries, cached_keys, cached_values, start, scale, window, 0.0)
    for r in range(n):
        expected = reference_attention_row(queries[r], keys, values, start + r + 1, scale, window)
        assert torch.allclose(together[r], expected, atol=1e-5, rtol=1e-4)
        alone = module.attention(queries[r : r + 1], cached_keys, cached_values, start + r, scale, window, 0.0)
        assert torch.equal(together[r], alone[0])


@pytest.mark.skipif(kernel.native() is None, reason="the C++ kernel is not built on this machine")
def test_the_native_cache_holds_keys_and_values_in_float16():
    """The native stack's cache is float16: half the bytes of a float32 one, holding the float32
    keys and values rounded (the first layer's, which nothing before them can change), and the
    logits stay near those of a float32 cache."""
    from app.engine.models.decoder import cached

    model = quantize_model(tiny_model(seed=8, hidden=64).model, 8)
    prompt = torch.arange(3, 90) % 96
    half, full = cached(model), cached(model, cache_dtype=torch.float32)
    logits_half, logits_full = half.forward(prompt, keep=1), full.forward(prompt, keep=1)
    assert half.keys[0].dtype == half.values[0].dtype == torch.float16 and full.keys[0].dtype == torch.float32
    assert half.cache_bytes * 2 == full.cache_bytes
    assert torch.equal(half.keys[0], full.keys[0].half()) and torch.equal(half.values[0], full.values[0].half())
    assert not torch.equal(logits_half, logits_full)  # the rounding reaches the logits ...
    # ... as a small change against their scale (a tiny random model's attention is sharp: 1.3%
    # here; the default target's, 0.7%), not the whole-unit errors of a misread cache
    assert (logits_half - logits_full).abs().max() < 0.05 * logits_full.abs().max()


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3", "gemma2", "gemma3"])
@pytest.mark.parametrize("isa", BUILDS)
def test_verified_rows_equal_rows_decoded_alone(isa, architecture, monkeypatch):
    """The whole low-bit target is batch invariant: logits of tokens verified together are
    bit-identical to decoding them one at a time. This is what keeps greedy speculative output
    equal to plain output even on near-ties."""
    from app.engine.models.decoder import cached

    module = built(isa)
    monkeypatch.setattr(kernel, "native", lambda: module)
    model = quantize_model(tiny_model(seed=6, hidden=64, architecture=architecture).model, 4)
    together, alone = cached(model), cached(model)
    prompt, tokens = torch.tensor([3, 9, 27, 81 % 96, 50]), torch.tensor([11, 22, 33, 44, 55, 66])
    together.forward(prompt, keep=1)
    alone.forward(prompt, keep=1)
    verified = together.forward(tokens, keep=len(tokens))
    decoded = torch.cat([alone.forward(tokens[i : i + 1], keep=1) for i in range(len(tokens))])
    assert torch.equal(verified, decoded)


@pytest.mark.skipif(kernel.native() is None, reason="the C++ kernel is not built on this machine")
@pytest.mark.parametrize("keep", [1, 10])  # 10: the rows kept span two chunks
def test_a_long_prompt_read_in_chunks_equals_one_call(keep, monkeypatch):
    """The native stack reads a long prompt PREFILL_CHUNK rows per call (bounded buffers): the
    kept logits and the cache it leaves are bit-identical to one call over the whole prompt."""
    from app.engine.models import lean_decoder
    from app.engine.models.decoder import cached

    model = quantize_model(tiny_model(seed=7, hidden=64).model, 4)
    prompt, follow = torch.arange(3, 43) % 96, torch.tensor([5, 6, 7])
    results = []
    for chunk in (7, 1000):
        monkeypatch.setattr(lean_decoder, "PREFILL_CHUNK", chunk)
        decoder = cached(model)
        assert decoder.stack is not None
        results.append((decoder.forward(prompt, keep=keep), decoder.forward(follow, keep=3)))
    (chunked, chunked_next), (whole, whole_next) = results
    assert chunked.shape[0] == keep
    assert torch.equal(chunked, whole) and torch.equal(chunked_next, whole_next)


@pytest.mark.parametrize("path", ["native", "python"])
def test_a_long_cache_grows_by_steps_and_keeps_what_it_held(path, monkeypatch):
    """Past CACHE_STEP tokens the cache grows by CACHE_STEP, not by doubling; growing keeps every
    cached key and value: what follows gets the logits a cache that never had to grow gives."""
    from app.engine.models import lean_decoder
    from app.engine.models.decoder import cached

    if path == "python":
        monkeypatch.setattr(kernel, "native", lambda: None)
    elif kernel.native() is None:
        pytest.skip("the C++ kernel is not built on this machine")
    monkeypatch.setattr(lean_decoder, "CACHE_STEP", 64)
    model = quantize_model(tiny_model(seed=7, hidden=64).model, 4)
    prompt, follow = torch.arange(3, 203) % 96, torch.tensor([5, 6, 7])
    grown, roomy = cached(model), cached(model)
    roomy._reserve(1000)
    sizes = []
    for first in range(0, 200, 50):  # 200 tokens in four requests: 256 at the first
        for decoder in (grown, roomy):
            decoder.feed(prompt[first : first + 50])
        sizes.append(grown.values[0].shape[2])
    grown.feed(torch.arange(70) % 96)  # 270 tokens: one step more, where doubling gave 512
    grown.rollback(200)
    assert sizes == [256] * 4 and grown.values[0].shape[2] == 320
    assert torch.equal(grown.forward(follow, keep=3), roomy.forward(follow, keep=3))


@pytest.mark.parametrize("path", ["native", "python"])
def test_rotary_embeddings_from_the_table_equal_those_worked_out_each_pass(path, monkeypatch):
    """The lean decoder looks each position's rotary cos and sin up in a table it makes when its
    cache grows: the logits are bit for bit those of working them out on every pass, across growth."""
    from app.engine.models.decoder import cached
    from app.engine.lowbit import skeleton

    if path == "python":
        monkeypatch.setattr(kernel, "native", lambda: None)
    elif kernel.native() is None:
        pytest.skip("the C++ kernel is not built on this machine")
    model = quantize_model(tiny_model(seed=7, hidden=64).model, 4)
    results = []
    for static in (True, False):
        monkeypatch.setattr(skeleton, "static_rope", lambda config: static)
        decoder = cached(model)
        decoder.feed(torch.arange(3, 203) % 96)
        decoder.feed(torch.arange(90) % 96)  # past the first 256 positions: the table grows too
        results.append(decoder.forward(torch.tensor([5, 6, 7]), keep=3))
        assert (decoder._rotary is not None) == static
    assert torch.equal(*results)


@pytest.mark.skipif(kernel.native() is None, reason="the C++ kernel is not built on this machine")
def test_a_built_kernel_is_loaded_as_it_is_without_a_compiler(tmp_path):
    """The library built for these sources is reused from its folder as it is, also from another
    checkout or environment (torch's builder would rebuild it there, or fail without tools)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    built = Path(kernel.native().__file__)
    folder = tmp_path / "kernels" / built.parent.name
    folder.mkdir(parents=True)
    shutil.copy(built, folder / built.name)
    shutil.copy(kernel._stamp(built), kernel._stamp(folder / built.name))  # the hash its build noted
    env = {**os.environ, "SPECCHAT_CACHE": str(tmp_path), "PATH": str(tmp_path / "no-tools"), "CXX": "false"}
    code = "from app.engine.lowbit import kernel; print(kernel.why_not_native(), kernel.native().__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.split() == ["None", str(folder / built.name)], out.stderr[-2000:]


def test_the_avx_vnni_build_compiles_with_its_instruction():
    """Intel CPUs since Alder Lake get an AVX-VNNI build. None is at hand here, so this checks
    that it compiles and uses the AVX-VNNI (VEX) encoding of the dot product; its kernel is the
    one the vnni256 build runs and the tests above check, in AVX-512's encoding."""
    import shutil
    import subprocess

    module, reason = kernel._build_for("avxvnni")
    assert module is not None, reason
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", module.__file__], capture_output=True, text=True).stdout
    assert "{vex} vpdpbusd" in code and "vpdpbusd %zmm" not in code
