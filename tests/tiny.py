"""Tiny random Qwen2-architecture (or Qwen3, Gemma 3) models built from a config in code (no files)."""
from __future__ import annotations

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from app.engine.models.loading import LoadedModel


def tiny_tokenizer(vocab_size: int, prefix: str = "t", padding: int = 0) -> PreTrainedTokenizerFast:
    """padding: that many placeholders after the tokens, as GGUF converters write them for
    embedding rows no token uses ("[PAD96]" at id 96)."""
    vocab = {f"{prefix}{i}": i for i in range(vocab_size)} | {f"[PAD{i}]": i for i in range(vocab_size, vocab_size + padding)}
    backend = Tokenizer(WordLevel(vocab, unk_token=f"{prefix}0"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=f"{prefix}0")


def tiny_model(
    seed: int,
    vocab_size: int = 96,
    hidden: int = 32,
    layers: int = 2,
    context: int = 256,
    init_range: float = 0.2,
    prefix: str = "t",
    architecture: str = "qwen2",
) -> LoadedModel:
    """architecture: "qwen2", "qwen3" (no q/k/v biases; each query and key head RMS-normalised,
    with random norm weights, so that a norm read from the wrong place shows), or "gemma3" (also
    norms after attention and the feed-forward layer, all with random weights; a local layer with
    a sliding window of 8 and a global one, each with its own rotary frequencies; queries scaled
    by a scalar of their own), or "gemma2" (Gemma 3's without head norms and local rotary
    frequencies, with attention scores and logits soft-capped at values tight enough to matter)."""
    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
                                 "gemma2": (Gemma2Config, Gemma2ForCausalLM),
                                 "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM)}[architecture]
    gemma = {"layer_types": ["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (layers % 2),
             "sliding_window": 8, "query_pre_attn_scalar": 24}
    gemma = {**gemma, "attn_logit_softcapping": 1.5, "final_logit_softcapping": 2.5} if architecture == "gemma2" else {
        **gemma, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    config = config_class(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        initializer_range=init_range,  # wider than usual so distributions have clear peaks
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **({"head_dim": hidden // 4} if architecture != "qwen2" else {}),  # Qwen3's default is 128, Gemma 3's 256
        **(gemma if architecture.startswith("gemma") else {}),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config).eval()
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if architecture.startswith("gemma") and name.endswith("norm.weight"):
                    parameter.uniform_(-0.5, 0.5)  # Gemma's norms scale by 1 + weight
                elif name.endswith(("q_norm.weight", "k_norm.weight")):
                    parameter.uniform_(0.5, 1.5)
    model.generation_config.eos_token_id = None
    return LoadedModel(name=f"tiny-{seed}", model=model, tokenizer=tiny_tokenizer(vocab_size, prefix))


def wide_low_bit(seed: int, bits: int, feed_forward_bits: int | None = None) -> LoadedModel:
    """A tiny low-bit model 64 wide: two groups per row, and q/k/v and gate/up fused."""
    from app.engine.lowbit.modules import quantize_model

    model = quantize_model(tiny_model(seed, hidden=64).model, bits, feed_forward_bits=feed_forward_bits)
    return LoadedModel(f"t-{seed}", model, tiny_model(seed).tokenizer)


def tiny_sliding_model(seed: int, window: int = 16, vocab_size: int = 96) -> LoadedModel:
    """A tiny Mistral-architecture model whose attention sees only the last `window` tokens."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           sliding_window=window, initializer_range=0.2, tie_word_embeddings=False,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = MistralForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    return LoadedModel(name=f"tiny-sliding-{seed}", model=model, tokenizer=tiny_tokenizer(vocab_size))
