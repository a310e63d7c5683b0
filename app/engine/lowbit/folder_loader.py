"""A Hugging Face model folder (fp16, bf16 or fp32 safetensors) quantized one tensor at a time.

Read whole as float32 first, a 7B folder needed 28 GB of memory before its quantization began, so
a 16 GB laptop could not load it at any precision. Here each tensor is read from its file a few
thousand rows at a time, made float32 and quantized: the load needs about the low-bit model's size
(a 7B-shaped bf16 folder at 8 bits: 9.2 GiB at the peak). The result is the very model the whole
float32 read gives (quantize_float of the same float32 values, row by row; tested), ready for the
store.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from . import gguf_weights, skeleton
from .loader import _check_complete, put_low_bit_modules
from .memory import give_back_freed_memory
from .modules import width_for
from .packing import PackedWeight, quantize_float

INDEX = "model.safetensors.index.json"


class NotStreamable(ValueError):
    """The folder's tensors do not map one to one onto the model's parameters (a checkpoint that
    transformers converts while loading): it is read whole instead."""


def checkpoint_files(folder: Path) -> list[Path]:
    """The folder's safetensors files: those its index names, else every one there."""
    index = folder / INDEX
    if index.is_file():
        return [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return sorted(folder.glob("*.safetensors"))


def load_folder_lowbit(folder: Path, bits: int, feed_forward_bits: int | None = None,
                       progress: Callable[[float], None] | None = None, group: int = 32) -> PreTrainedModel:
    """Every weight matrix (and the embedding) in `bits` bits, the feed-forward ones in
    feed_forward_bits where given, as modules.quantize_model makes them from the whole float model."""
    files = checkpoint_files(folder)
    if not files:
        raise NotStreamable(f"{folder} holds no safetensors files")
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    with init_empty_weights():  # parameters on the meta device; buffers (rotary tables) real
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    modules = dict(model.named_modules())
    parameters = dict(model.named_parameters(remove_duplicate=False))
    tied_output = f"{_name_of(model, model.get_output_embeddings())}.weight" if config.tie_word_embeddings else None
    packed: dict[str, PackedWeight] = {}
    total, done = sum(len(_keys(file)) for file in files), 0
    for file in files:
        with safe_open(file, framework="pt") as reader:
            for key in reader.keys():
                done += 1
                if progress:
                    progress(done / total)
                if key == tied_output:  # some tied checkpoints store the output layer too: the tie makes it
                    continue
                if key not in parameters:
                    raise NotStreamable(f"{file.name}: {key} is no parameter of {type(model).__name__}")
                module_name, _, attribute = key.rpartition(".")
                module = modules[module_name]
                if attribute == "weight" and _quantized(module, group):
                    width = bits if isinstance(module, nn.Embedding) else width_for(module_name, bits, feed_forward_bits)
                    packed[module_name] = _quantized_rows(reader.get_slice(key), width, group)
                    give_back_freed_memory()  # its rows' temporaries (the 1.5B's first start: 3.17 -> 2.79 GiB)
                else:
                    module._parameters[attribute] = nn.Parameter(reader.get_tensor(key).float(), requires_grad=False)
    put_low_bit_modules(model, packed)
    try:
        _check_complete(model, folder)
    except ValueError as error:
        raise NotStreamable(str(error)) from error
    skeleton.divide_rope_frequencies(model)  # a folder dequantized from a Llama 3.1+ GGUF
    return model.eval()


def _keys(file: Path) -> list[str]:
    with safe_open(file, framework="pt") as reader:
        return list(reader.keys())


def _quantized_rows(weight, bits: int, group: int) -> PackedWeight:
    """weight: safetensors' slice of one [N, K] tensor, read and quantized some rows at a time (a 7B's embedding whole as float32 is 2.2 GB,
    and quantizing it took twice that again: its first start peaked at 13.3 GiB for an 8.0 GiB
    model); quantize_float treats each row on its own, so the parts join into the whole's result."""
    rows = weight.get_shape()[0]
    step = gguf_weights.REQUANTIZED_ROWS
    return PackedWeight.joined([quantize_float(weight[first : first + step].float(), bits, group)
                                for first in range(0, rows, step)])


def _quantized(module: nn.Module, group: int) -> bool:
    """Whether quantize_model replaces this module (its inputs a whole number of groups)."""
    return (isinstance(module, nn.Linear) and module.in_features % group == 0) or \
        (isinstance(module, nn.Embedding) and module.embedding_dim % group == 0)


def _name_of(model: nn.Module, module: nn.Module | None) -> str | None:
    return next((name for name, m in model.named_modules() if m is module), None)
