"""Decoder GGUFs written from arrays: tiny files for the tests, random full-size ones for timing
architectures whose weights cannot be downloaded here (tools/random_gguf.py).

Norm weights are written as the file stores them: Gemma's as 1 + w, as llama.cpp's converter
writes them (transformers' reading subtracts the 1 again).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

# Per-layer norms besides attn_norm and ffn_norm, by architecture
HEAD_NORMS = ("attn_q_norm", "attn_k_norm")
OUTPUT_NORMS = ("post_attention_norm", "post_ffw_norm")
EXTRA_NORMS = {"qwen3": HEAD_NORMS, "gemma2": OUTPUT_NORMS, "gemma3": (*HEAD_NORMS, *OUTPUT_NORMS)}
BIASED = ("qwen2",)  # q, k and v projections with biases


@dataclass(frozen=True)
class Shape:
    layers: int
    width: int
    inner: int
    heads: int
    kv_heads: int
    head_dim: int
    vocabulary: int
    rope_base: float = 1_000_000.0
    sliding_window: int | None = None  # Gemma 3's local layers
    rope_linear_factor: float | None = None  # Gemma 3 4B and larger: its global layers' rotary scaling
    soft_caps: tuple[float, float] | None = None  # Gemma 2's, of attention scores and of logits
    context: int = 32768


def write(path: Path, architecture: str, shape: Shape, weight: Callable[[str, tuple[int, int]], tuple],
          norm: Callable[[int], np.ndarray], tied: bool = True, tokenizer_from: Path | None = None,
          extra: dict[str, np.ndarray] | None = None) -> None:
    """weight(name, shape) -> (array, raw_dtype or None) of the [rows, columns] matrix of that GGUF
    name; norm(n) -> float32 [n] (also Qwen2's biases). tokenizer_from: a GGUF whose tokenizer
    entries are copied (else none is written), its tokens padded to the vocabulary as llama.cpp's
    converter pads them. extra: more tensors by GGUF name (rope_freqs.weight: Llama 3's rotary
    frequency divisors)."""
    s = shape
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.width)
    writer.add_block_count(s.layers)
    writer.add_feed_forward_length(s.inner)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_rope_freq_base(s.rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(s.vocabulary)
    if s.sliding_window:
        writer.add_sliding_window(s.sliding_window)
    if s.soft_caps:
        writer.add_attn_logit_softcapping(s.soft_caps[0])
        writer.add_final_logit_softcapping(s.soft_caps[1])
    if s.rope_linear_factor:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(s.rope_linear_factor)
    if tokenizer_from is not None:
        for name, field in gguf.GGUFReader(tokenizer_from).fields.items():
            if name.startswith("tokenizer."):
                sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
                writer.add_key_value(name, _padded(name, field.contents(), s.vocabulary), field.types[0],
                                     sub_type=sub_type)

    def add_matrix(name: str, rows: int, columns: int) -> None:
        array, raw_dtype = weight(name, (rows, columns))
        writer.add_tensor(name, array, raw_dtype=raw_dtype)

    add_matrix("token_embd.weight", s.vocabulary, s.width)
    if not tied:
        add_matrix("output.weight", s.vocabulary, s.width)
    writer.add_tensor("output_norm.weight", norm(s.width))
    for name, tensor in (extra or {}).items():
        writer.add_tensor(name, tensor)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        for name in ("attn_norm", "ffn_norm", *EXTRA_NORMS.get(architecture, ())):
            writer.add_tensor(f"blk.{i}.{name}.weight", norm(s.head_dim if name in HEAD_NORMS else s.width))
        for name, rows, columns in [("attn_q", q, s.width), ("attn_k", kv, s.width), ("attn_v", kv, s.width),
                                    ("attn_output", s.width, q), ("ffn_gate", s.inner, s.width),
                                    ("ffn_up", s.inner, s.width), ("ffn_down", s.width, s.inner)]:
            add_matrix(f"blk.{i}.{name}.weight", rows, columns)
            if architecture in BIASED and name in ("attn_q", "attn_k", "attn_v"):
                writer.add_tensor(f"blk.{i}.{name}.bias", norm(rows))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _padded(name: str, value, vocabulary: int):
    """A placeholder token for each embedding row past the tokenizer's ("[PAD151936]", unused),
    as llama.cpp's converter writes a Qwen2.5 7B's 152,064 rows around 151,665 tokens."""
    if name == "tokenizer.ggml.tokens":
        return value + [f"[PAD{i}]" for i in range(len(value), vocabulary)]
    if name == "tokenizer.ggml.token_type":
        return value + [int(gguf.TokenType.UNUSED)] * (vocabulary - len(value))
    return value


def write_tokenizer(path: Path, tokenizer) -> None:
    """A GGUF holding only a byte-level BPE tokenizer's entries (a transformers fast tokenizer with an
    <|endoftext|> token), in llama.cpp's gpt2 layout: for write's tokenizer_from."""
    import json

    backend = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = backend["vocab"]
    words = gguf.GGUFWriter(str(path), "qwen2")
    words.add_tokenizer_model("gpt2")
    words.add_tokenizer_pre("qwen2")
    words.add_token_list([token for token, _ in sorted(vocab.items(), key=lambda item: item[1])])
    words.add_token_types([1] * len(vocab))
    words.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in backend["merges"]])
    words.add_eos_token_id(vocab["<|endoftext|>"])
    for write in (words.write_header_to_file, words.write_kv_data_to_file, words.write_tensors_to_file, words.close):
        write()
