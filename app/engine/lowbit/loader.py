"""A Hugging Face model whose linear layers and embeddings run from a GGUF's own low-bit blocks:
no float copy of the weights in memory or on disk."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from accelerate import init_empty_weights
from gguf import GGMLQuantizationType, dequantize
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

from . import gguf_file, skeleton
from .gguf_weights import packed_from_gguf
from .modules import LowBitEmbedding, LowBitLinear, width_for
from .packing import PackedWeight

FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
ROPE_FREQS = "rope_freqs.weight"


def load_gguf_lowbit(path: Path, requantize_bits: int | None = None,
                     progress: Callable[[float], None] | None = None,
                     feed_forward_bits: int | None = None) -> PreTrainedModel:
    """requantize_bits: re-quantize every weight matrix to this many bits (a cheaper draft);
    feed_forward_bits: the feed-forward matrices to this many instead."""
    reader = gguf_file.parse(path)  # one parse for the config and the tensors
    config = gguf_file.config_of(reader, path)
    _take_head_dim(config, reader)
    if config.model_type in ("gemma2", "gemma3_text"):
        _take_gemma_settings(config, reader)
    with init_empty_weights():  # parameters on the meta device; buffers (rotary tables) real
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    # transformers names a Gemma 3 GGUF's model gemma3_text, and its processor (the norms' 1 + w) gemma3
    kind = {"gemma3_text": "gemma3"}.get(config.model_type, config.model_type)
    processor = TENSOR_PROCESSORS.get(kind, TensorProcessor)(config=config.to_dict())
    names = gguf_file.hf_names(model, processor)  # GGUF name -> HF parameter name
    modules = dict(model.named_modules())
    packed_by_name = {}
    for index, tensor in enumerate(reader.tensors):
        hf_name = names.get(tensor.name)
        if hf_name is None:
            continue
        module_name, _, attribute = hf_name.rpartition(".")
        module = modules[module_name]
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the fastest dimension first
        _check_shape(tensor.name, shape, module, attribute, hf_name)
        if attribute == "weight" and isinstance(module, (nn.Linear, nn.Embedding)) and len(shape) == 2 \
                and (tensor.tensor_type not in FLOAT_TYPES or requantize_bits):
            order = _row_order(processor, tensor.name, shape[0])
            bits = width_for(module_name, requantize_bits, feed_forward_bits)
            packed = packed_from_gguf(tensor.data, tensor.tensor_type, shape, order, bits)
            packed_by_name[module_name] = packed
        else:
            value = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            value = processor.process(weights=value, name=tensor.name).weights
            module._parameters[attribute] = nn.Parameter(torch.from_numpy(np.array(value, dtype=np.float32)),
                                                         requires_grad=False)
        if progress:
            progress((index + 1) / len(reader.tensors))
    put_low_bit_modules(model, packed_by_name)
    take_rope_divisors(model, reader)
    _check_complete(model, path)
    return model.eval()


def put_low_bit_modules(model: nn.Module, packed_by_name: dict[str, PackedWeight]) -> None:
    """Each packed weight in place of its float module (an embedding's scale and a linear's bias
    kept), and a tied output layer on the packed embedding."""
    modules = dict(model.named_modules())
    for module_name, packed in packed_by_name.items():
        parent_name, _, child = module_name.rpartition(".")
        old = modules[module_name]
        new = LowBitEmbedding(packed, getattr(old, "scalar_embed_scale", None)) if isinstance(old, nn.Embedding) else \
            LowBitLinear(packed, _real(old.bias), old.out_features)
        setattr(modules[parent_name] if parent_name else model, child, new)
    if model.config.tie_word_embeddings and "lm_head" not in packed_by_name:
        embedding = model.get_input_embeddings()
        if isinstance(embedding, LowBitEmbedding):
            model.lm_head = LowBitLinear(embedding.packed, out_features=model.lm_head.out_features)


def take_rope_divisors(model: nn.Module, reader) -> None:
    """A GGUF's rotary frequency divisors (Llama 3.1 and later, see skeleton.divide_rope_frequencies)
    into the model's config (the store keeps them) and its rotary table."""
    tensor = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if tensor is not None:
        model.config.rope_freq_divisors = [float(d) for d in dequantize(tensor.data, tensor.tensor_type).reshape(-1)]
        skeleton.divide_rope_frequencies(model)


def _take_head_dim(config, reader) -> None:
    """The file's width per attention head, where it names one: transformers' GGUF reading leaves
    Qwen3's config at its default of 128 whatever the file says."""
    field = reader.fields.get(f"{reader.fields['general.architecture'].contents()}.attention.key_length")
    if field is not None and hasattr(config, "head_dim"):
        config.head_dim = int(field.contents())


def _take_gemma_settings(config, reader) -> None:
    """What a Gemma 2 or 3 GGUF implies and transformers' reading leaves at its defaults, as
    llama.cpp reads it: queries scaled by 1 / sqrt(head width) (1 / sqrt(width / heads) for the 27B
    models: 46 layers for Gemma 2, 62 for Gemma 3); Gemma 2's soft caps; Gemma 3's global layers'
    rotary scaling (linear, a factor of 8 on the 4B and larger)."""
    gemma3 = config.model_type == "gemma3_text"
    large = config.num_hidden_layers == (62 if gemma3 else 46)
    config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads if large else config.head_dim
    field = lambda key: reader.fields.get(f"{'gemma3' if gemma3 else 'gemma2'}.{key}")
    if not gemma3:
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if field(key) is not None:
                setattr(config, key, float(field(key).contents()))
    kind, factor = field("rope.scaling.type"), field("rope.scaling.factor")
    if gemma3 and kind is not None and factor is not None and kind.contents() == "linear":
        config.rope_parameters["full_attention"].update(rope_type="linear", factor=float(factor.contents()))


def _real(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None or bias.is_meta else bias


def _row_order(processor: TensorProcessor, name: str, rows: int) -> np.ndarray | None:
    """How the architecture's tensor processor reorders this weight's rows (q/k heads on llama)."""
    probe = np.arange(rows, dtype=np.float32).reshape(rows, 1)
    moved = processor.process(weights=probe, name=name).weights
    if moved.shape != probe.shape:
        raise ValueError(f"{name}: this architecture changes GGUF weights in a way low-bit loading does not support")
    order = moved[:, 0].astype(np.int64)
    return None if np.array_equal(order, np.arange(rows)) else order


def _check_shape(name: str, shape: tuple[int, ...], module: nn.Module, attribute: str, hf_name: str) -> None:
    """Refuses a file tensor whose shape is not the parameter's it fills, as the config describes
    the model: the kernels index by the config's sizes, so a short tensor would be read past its end."""
    expected = getattr(module, attribute, None)
    if not isinstance(expected, torch.Tensor):
        raise ValueError(f"tensor {name} maps to {hf_name}, which the model its config describes does not have")
    if tuple(expected.shape) != shape:
        raise ValueError(f"tensor {name} has shape {list(shape)}, but the model its config describes needs "
                         f"{list(expected.shape)} for {hf_name}")


def _check_complete(model: nn.Module, path: Path) -> None:
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    missing += [name for name, b in model.named_buffers() if b.is_meta]
    if missing:
        raise ValueError(f"{path.name} lacks {len(missing)} tensors the model needs (first: {missing[0]})")
