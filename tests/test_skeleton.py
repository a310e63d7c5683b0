"""A low-bit model from the cache loads into our own module tree (no transformers modeling code)
and computes exactly what the transformers model it was saved from computes."""
import json

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from app.engine.models import lean_decoder
from app.engine.models.transformers_decoder import TransformersDecoder
from app.engine.models.decoder import cached
from app.engine.lowbit import kernel, skeleton, prepared_tensors as store
from app.engine.lowbit.modules import quantize_model
from tests.tiny import tiny_model


def saved_and_loaded(tmp_path, architecture="qwen2"):
    original = tiny_model(seed=8, hidden=64, architecture=architecture)
    with torch.no_grad():  # Qwen2's q/k/v biases start at zero; real models' do not
        for name, parameter in original.model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(generator=torch.Generator().manual_seed(len(name)))
    model = quantize_model(original.model, 4)
    store.save(model, original.tokenizer, tmp_path / "stored")
    loaded, _ = store.load(tmp_path / "stored")
    return model, loaded


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3", "gemma2", "gemma3"])
@pytest.mark.parametrize("native", [True, False])  # the C++ layer stack, and the Python loop
def test_a_stored_model_loads_into_the_skeleton_and_computes_the_same_logits(tmp_path, native, architecture,
                                                                              monkeypatch):
    if not native:
        monkeypatch.setattr(kernel, "native", lambda: None)
    elif kernel.native() is None:
        pytest.skip("the C++ kernel is not built on this machine")
    model, loaded = saved_and_loaded(tmp_path, architecture)
    assert isinstance(loaded, skeleton.CausalLM)
    assert loaded.generation_config.eos_token_id == model.generation_config.eos_token_id
    # reference: transformers' forward; float32 keys and values, as its cache holds them (float16,
    # the native default, is tested in test_lowbit)
    original, ours = cached(model, cache_dtype=torch.float32), cached(loaded, cache_dtype=torch.float32)
    reference = TransformersDecoder(model)
    assert isinstance(ours, lean_decoder.LeanDecoder) and (ours.stack is not None) == native
    prompt, verified = torch.arange(3, 40) % 96, torch.tensor([5, 17, 29, 41])
    for tokens, keep in ((prompt, 1), (verified, len(verified))):
        logits = ours.forward(tokens, keep)
        assert torch.equal(logits, original.forward(tokens, keep))
        assert torch.allclose(logits, reference.forward(tokens, keep), atol=1e-4, rtol=1e-4)


def test_the_store_keeps_projections_fused(tmp_path):
    """q/k/v and gate/up are stored fused and load as one weight each that the separate modules
    view (each weight once in memory), with the biases of both; tied weights are stored once."""
    from app.engine.models.cpu_linear import model_bytes

    model, loaded = saved_and_loaded(tmp_path)
    layout = json.loads((tmp_path / "stored" / store.LAYOUT).read_text())["modules"]
    attention = loaded.model.layers[0].self_attn
    assert layout["model.layers.0.self_attn.k_proj"]["weights_of"] == "model.layers.0.self_attn.fused_qkv"
    for part in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert part.w_q.untyped_storage().data_ptr() == attention.fused_qkv.w_q.untyped_storage().data_ptr()
        assert part.bias is not None and part.bias.abs().sum() > 0  # Qwen2's, given values above
    assert torch.equal(attention.fused_qkv.bias, torch.cat([attention.q_proj.bias, attention.k_proj.bias,
                                                           attention.v_proj.bias]))
    mlp = loaded.model.layers[1].mlp
    assert mlp.up_proj.w_q.untyped_storage().data_ptr() == mlp.fused_gate_up.w_q.untyped_storage().data_ptr()
    assert lean_decoder.fused_projections(loaded)[0][0] is attention.fused_qkv
    # every tensor copied into one buffer (asked to be backed by huge pages), counted without its gaps
    assert loaded.lm_head.w_q.untyped_storage().data_ptr() == attention.fused_qkv.w_q.untyped_storage().data_ptr()
    assert model_bytes(loaded) == model_bytes(model)
    tied = tiny_model(seed=8, hidden=64)
    tied.model.lm_head.weight = tied.model.model.embed_tokens.weight
    store.save(quantize_model(tied.model, 4), tied.tokenizer, tmp_path / "tied")
    layout = json.loads((tmp_path / "tied" / store.LAYOUT).read_text())["modules"]
    assert layout["model.embed_tokens"]["weights_of"] == "lm_head"


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3", "gemma2", "gemma3"])
def test_as_transformers_wraps_the_same_weights(tmp_path, architecture):
    model, loaded = saved_and_loaded(tmp_path, architecture)
    wrapped = skeleton.as_transformers(loaded)
    assert wrapped.lm_head is loaded.lm_head
    ids = torch.arange(1, 30).view(1, -1) % 96
    with torch.no_grad():
        assert torch.allclose(wrapped(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)
    assert skeleton.as_transformers(model) is model


def test_scaled_rotary_embeddings_match_transformers():
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 1024})
    assert skeleton.can_build(config)
    positions = torch.arange(0, 3000, 7).view(1, -1)
    x = torch.zeros(1)
    for ours, theirs in zip(skeleton.RotaryEmbedding(config)(x, positions), LlamaRotaryEmbedding(config)(x, positions)):
        assert torch.equal(ours, theirs)


def test_other_architectures_keep_transformers_model():
    assert skeleton.can_build(Qwen2Config())
    assert not skeleton.can_build(Qwen2Config(use_sliding_window=True, sliding_window=16))
    assert not skeleton.can_build(LlamaConfig(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                                               "factor": 2.0}))
