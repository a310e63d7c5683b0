"""A Qwen3-shaped GGUF with random weights, to time Qwen3 models without downloading one.

Its answers are noise and a random draft agrees with nothing, so only plain decoding's speed and
speculation's exactness mean anything on it. The tokenizer is the default target's (Qwen3 uses
Qwen2.5's vocabulary). Needs the `.[peers]` extra: llama.cpp quantizes the float16 file.

    python tools/random_qwen3_gguf.py 1.7b Q4_K_M qwen3-1.7b-q4_k_m.gguf
    python tools/random_qwen3_gguf.py 0.6b Q8_0 qwen3-0.6b-q8_0.gguf
"""
from __future__ import annotations

import argparse
import ctypes
import tempfile
from pathlib import Path

import gguf
import numpy as np

from app.engine import default_models

SHAPES = {"1.7b": (28, 2048, 6144, 16, 8), "0.6b": (28, 1024, 3072, 16, 8)}  # layers, width, inner, heads, kv heads
HEAD_DIM, VOCABULARY = 128, 151936
FILE_TYPES = {"Q4_K_M": 15, "Q8_0": 7}  # llama.cpp's llama_ftype


def write_float16(size: str, path: Path, tokenizer_from: Path) -> None:
    layers, width, inner, heads, kv_heads = SHAPES[size]
    rng = np.random.default_rng(0)
    weight = lambda *shape: (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_context_length(40960)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(inner)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(1)
    for name, field in gguf.GGUFReader(tokenizer_from).fields.items():
        if name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_tensor("token_embd.weight", weight(VOCABULARY, width))  # tied: no output.weight
    writer.add_tensor("output_norm.weight", norm(width))
    for i in range(layers):
        tensors = {
            "attn_norm": norm(width), "attn_q": weight(heads * HEAD_DIM, width),
            "attn_k": weight(kv_heads * HEAD_DIM, width), "attn_v": weight(kv_heads * HEAD_DIM, width),
            "attn_q_norm": norm(HEAD_DIM), "attn_k_norm": norm(HEAD_DIM),
            "attn_output": weight(width, heads * HEAD_DIM), "ffn_norm": norm(width),
            "ffn_gate": weight(inner, width), "ffn_up": weight(inner, width), "ffn_down": weight(width, inner),
        }
        for name, tensor in tensors.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize(source: Path, out: Path, file_type: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {source}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", choices=SHAPES)
    parser.add_argument("type", choices=FILE_TYPES)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.out.parent) as folder:
        tokenizer_from = default_models.assemble(default_models.TARGET, Path(folder) / "target.gguf")
        float16 = Path(folder) / "f16.gguf"
        write_float16(args.size, float16, tokenizer_from)
        quantize(float16, args.out, args.type)


if __name__ == "__main__":
    main()
