"""A Qwen3-, Gemma 2-, Gemma 3-, Llama 3.2- or Qwen2.5 7B-shaped GGUF with random weights, to time those
models without downloading one.

Its answers are noise and a random draft agrees with nothing, so only plain decoding's speed and
speculation's exactness mean anything on it. The tokenizer is the default target's (Qwen3 uses
Qwen2.5's vocabulary; Gemma 3's own has 262,144 tokens, so its output layer is larger than
these files'), padded to the shape's vocabulary as llama.cpp's converter pads it. Needs the
`.[peers]` extra: llama.cpp quantizes the float16 file. `--random-codes` writes random Q4_K_M
blocks instead (llama.cpp's mix of Q4_K and Q6_K tensors, no float16 file: a 7B's would take
15 GB), and needs no extra.

    python tools/random_gguf.py qwen3-1.7b Q4_K_M qwen3-1.7b-q4_k_m.gguf
    python tools/random_gguf.py gemma3-270m Q8_0 gemma3-270m-q8_0.gguf
    python tools/random_gguf.py llama3.2-1b Q4_K_M llama3.2-1b-q4_k_m.gguf
    python tools/random_gguf.py qwen2.5-7b Q4_K_M qwen2.5-7b-q4_k_m.gguf --random-codes

Llama 3.2's file carries its rotary scaling as llama.cpp's converter writes it: a divisor per
frequency (rope_freqs.weight).
"""
from __future__ import annotations

import argparse
import ctypes
import tempfile
from pathlib import Path

import numpy as np

from app.engine import default_models
from app.engine.lowbit import gguf_writing
from app.engine.lowbit.gguf_writing import Shape

VOCABULARY = 151936
SHAPES = {  # layers, width, inner, heads, kv heads, head width (the published models' configs)
    "qwen3-1.7b": ("qwen3", Shape(28, 2048, 6144, 16, 8, 128, VOCABULARY)),
    "qwen3-0.6b": ("qwen3", Shape(28, 1024, 3072, 16, 8, 128, VOCABULARY)),
    "gemma3-1b": ("gemma3", Shape(26, 1152, 6912, 4, 1, 256, VOCABULARY, sliding_window=512)),
    "gemma3-270m": ("gemma3", Shape(18, 640, 2048, 4, 1, 256, VOCABULARY, sliding_window=512)),
    "gemma2-2b": ("gemma2", Shape(26, 2304, 9216, 8, 4, 256, VOCABULARY, rope_base=10000.0, sliding_window=4096,
                                  soft_caps=(50.0, 30.0))),
    "llama3.2-1b": ("llama", Shape(16, 2048, 8192, 32, 8, 64, VOCABULARY, rope_base=500000.0)),
    "qwen2.5-7b": ("qwen2", Shape(28, 3584, 18944, 28, 4, 128, 152064)),
}
UNTIED = ("qwen2.5-7b",)  # an output layer of its own; the others' reuse the embeddings
# Llama 3.2's rotary scaling (its config's rope_scaling)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
FILE_TYPES = {"Q4_K_M": 15, "Q8_0": 7}  # llama.cpp's llama_ftype


def write_random(size: str, path: Path, tokenizer_from: Path, codes: bool = False) -> None:
    """Float16 weights, or with `codes` random Q4_K_M blocks."""
    architecture, shape = SHAPES[size]
    rng = np.random.default_rng(0)
    float16 = lambda name, rows_columns: ((rng.standard_normal(rows_columns, dtype=np.float32) * 0.02).astype(np.float16), None)
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    extra = {"rope_freqs.weight": llama3_divisors(shape)} if architecture == "llama" else None
    gguf_writing.write(path, architecture, shape, random_q4_k_m(rng, shape.layers) if codes else float16, norm,
                       tied=size not in UNTIED, tokenizer_from=tokenizer_from, extra=extra)


def random_q4_k_m(rng: np.random.Generator, layers: int):
    """weight(name, shape) of random blocks in llama.cpp's Q4_K_M mix: Q6_K for the output layer and
    for attn_v and ffn_down in its chosen layers, Q4_K elsewhere; the float16 steps set so that the
    weights spread about as a model's do (standard deviation about 0.02)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    more_bits = lambda i: i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2  # llama.cpp's use_more_bits
    halves = {Q.Q4_K: {0: 1e-4, 2: 7.5e-4}, Q.Q6_K: {208: 1.5e-5}}  # offset in the block: step (Q4_K: d, dmin)

    def weight(name: str, rows_columns: tuple[int, int]):
        layer = int(name.split(".")[1]) if name.startswith("blk.") else None
        six = name == "output.weight" or (layer is not None and name.split(".")[2] in ("attn_v", "ffn_down") and more_bits(layer))
        qtype = Q.Q6_K if six else Q.Q4_K
        rows, columns = rows_columns
        block, size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (rows, columns // block, size), dtype=np.uint8)
        for offset, step in halves[qtype].items():
            blocks[:, :, offset:offset + 2] = np.array([step], np.float16).view(np.uint8)
        return blocks.reshape(rows, -1), qtype

    return weight


def llama3_divisors(shape: Shape) -> np.ndarray:
    """What llama.cpp's converter writes as rope_freqs: each plain frequency over the scaled one."""
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=shape.width, num_attention_heads=shape.heads, head_dim=shape.head_dim,
                         rope_parameters={**LLAMA3_SCALING, "rope_theta": shape.rope_base})
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    plain = 1.0 / (shape.rope_base ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float) / shape.head_dim))
    return (plain / scaled).numpy()


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
    parser.add_argument("--random-codes", action="store_true", help="random Q4_K_M blocks, no llama.cpp needed")
    args = parser.parse_args()
    if args.random_codes and args.type != "Q4_K_M":
        parser.error("--random-codes writes Q4_K_M")
    with tempfile.TemporaryDirectory(dir=args.out.parent) as folder:
        tokenizer_from = default_models.assemble(default_models.TARGET, Path(folder) / "target.gguf")
        if args.random_codes:
            write_random(args.size, args.out, tokenizer_from, codes=True)
            return
        float16 = Path(folder) / "f16.gguf"
        write_random(args.size, float16, tokenizer_from)
        quantize(float16, args.out, args.type)


if __name__ == "__main__":
    main()
