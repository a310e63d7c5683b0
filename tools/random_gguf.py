"""A Qwen3-, Gemma 2-, Gemma 3- or Llama 3.2-shaped GGUF with random weights, to time those models without
downloading one.

Its answers are noise and a random draft agrees with nothing, so only plain decoding's speed and
speculation's exactness mean anything on it. The tokenizer is the default target's (Qwen3 uses
Qwen2.5's vocabulary; Gemma 3's own has 262,144 tokens, so its output layer is larger than
these files'). Needs the `.[peers]` extra: llama.cpp quantizes the float16 file.

    python tools/random_gguf.py qwen3-1.7b Q4_K_M qwen3-1.7b-q4_k_m.gguf
    python tools/random_gguf.py gemma3-270m Q8_0 gemma3-270m-q8_0.gguf
    python tools/random_gguf.py llama3.2-1b Q4_K_M llama3.2-1b-q4_k_m.gguf

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
}
# Llama 3.2's rotary scaling (its config's rope_scaling)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
FILE_TYPES = {"Q4_K_M": 15, "Q8_0": 7}  # llama.cpp's llama_ftype


def write_float16(size: str, path: Path, tokenizer_from: Path) -> None:
    architecture, shape = SHAPES[size]
    rng = np.random.default_rng(0)
    weight = lambda rows_columns: ((rng.standard_normal(rows_columns, dtype=np.float32) * 0.02).astype(np.float16), None)
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    extra = {"rope_freqs.weight": llama3_divisors(shape)} if architecture == "llama" else None
    gguf_writing.write(path, architecture, shape, weight, norm, tokenizer_from=tokenizer_from, extra=extra)


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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.out.parent) as folder:
        tokenizer_from = default_models.assemble(default_models.TARGET, Path(folder) / "target.gguf")
        float16 = Path(folder) / "f16.gguf"
        write_float16(args.size, float16, tokenizer_from)
        quantize(float16, args.out, args.type)


if __name__ == "__main__":
    main()
