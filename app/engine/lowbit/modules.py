"""nn.Modules that hold packed low-bit weights in place of nn.Linear and nn.Embedding."""
from __future__ import annotations

import torch
from torch import nn

from . import kernel
from .packing import PackedWeight, quantize_float


class _Packed(nn.Module):
    def __init__(self, weight: PackedWeight) -> None:
        super().__init__()
        self.bits, self.group = weight.bits, weight.group
        for name, tensor in weight.tensors().items():
            self.register_buffer(f"w_{name}", tensor)

    @property
    def packed(self) -> PackedWeight:
        return PackedWeight(*(getattr(self, f"w_{name}") for name in PackedWeight.TENSORS), bits=self.bits, group=self.group)


class LowBitLinear(_Packed):
    def __init__(self, weight: PackedWeight, bias: torch.Tensor | None = None, out_features: int | None = None) -> None:
        super().__init__(weight)
        # out_features: the real outputs; the packed weight may carry zero rows of padding
        self.in_features = weight.in_features
        self.out_features = out_features or (bias.shape[0] if bias is not None else weight.out_features)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        out = kernel.linear(x.reshape(-1, self.in_features).float(), self.packed)
        if out.shape[1] != self.out_features:
            out = out[:, : self.out_features]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.bits}-bit, groups of {self.group}"


class LowBitEmbedding(_Packed):
    def __init__(self, weight: PackedWeight, scale: float | None = None) -> None:
        """scale: what the rows are multiplied by (Gemma's embedding: the width's square root)."""
        super().__init__(weight)
        self.embedding_dim = weight.in_features
        self.scalar_embed_scale = scale  # transformers' name for it on Gemma's embedding

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [...] long -> [..., dim]
        rows = kernel.rows(ids.reshape(-1), self.packed).view(*ids.shape, self.embedding_dim)
        return rows if self.scalar_embed_scale is None else rows * embedding_scale(self)


def embedding_scale(embedding: nn.Module) -> torch.Tensor | None:
    """A scaled embedding's scale as float32, as transformers rounds it; None for others."""
    scale = getattr(embedding, "scalar_embed_scale", None)
    return None if scale is None else torch.tensor(scale, dtype=torch.float32)


def width_for(module_name: str, bits: int | None, feed_forward_bits: int | None) -> int | None:
    """The bits a re-quantized matrix gets: feed_forward_bits for a feed-forward (MLP) projection of
    a Llama/Qwen2-style decoder layer (most of a layer's weights, and where a draft tolerates the
    fewest bits) when given, else bits."""
    return feed_forward_bits if feed_forward_bits and ".mlp." in f".{module_name}." else bits


def quantize_model(model: nn.Module, bits: int, group: int = 32, feed_forward_bits: int | None = None) -> nn.Module:
    """Replace every nn.Linear and nn.Embedding of a float model by low-bit modules, in place
    (a Hugging Face folder in fp16/bf16/fp32, quantized on load); feed_forward_bits: the
    feed-forward projections in this many bits instead."""
    packed: dict[int, PackedWeight] = {}  # tied weights are packed once

    def packed_of(weight: torch.Tensor, width: int) -> PackedWeight:
        key = weight.data_ptr()
        if key not in packed:
            packed[key] = quantize_float(weight, width, group)
        return packed[key]

    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.in_features % group == 0:
                width = width_for(f"{parent_name}.{name}", bits, feed_forward_bits)
                setattr(parent, name, LowBitLinear(packed_of(child.weight, width), child.bias, child.out_features))
            elif isinstance(child, nn.Embedding) and child.embedding_dim % group == 0:
                scale = getattr(child, "scalar_embed_scale", None)
                setattr(parent, name, LowBitEmbedding(packed_of(child.weight, bits), scale))
    return model


# Per decoder layer block, the fused projection's name and the projections it computes
FUSED = {"self_attn": ("fused_qkv", ("q_proj", "k_proj", "v_proj")), "mlp": ("fused_gate_up", ("gate_proj", "up_proj"))}


def fuse_projections(layers: nn.ModuleList) -> None:
    """Per Llama-style decoder layer, q/k/v and gate/up as one low-bit linear each where their
    formats agree, held beside them (self_attn.fused_qkv, mlp.fused_gate_up), so the store keeps
    them fused and a loaded model needs no copy. Blocks fused already are left as they are."""
    for layer in layers:
        for block_name, (fused_name, part_names) in FUSED.items():
            block = getattr(layer, block_name)
            if not hasattr(block, fused_name):
                fused = fuse([getattr(block, name) for name in part_names])
                if fused is not None:
                    setattr(block, fused_name, fused)


def fuse(linears: list[nn.Module]) -> LowBitLinear | None:
    """One low-bit linear computing several that read the same input (q/k/v, gate/up), or None
    when they differ in format. The originals are re-pointed at slices of the fused weight, so
    the weights stay in memory once."""
    if not all(isinstance(m, LowBitLinear) for m in linears):
        return None
    if len({(m.bits, m.group, m.in_features) for m in linears}) != 1 or any(m.packed.out_features != m.out_features for m in linears):
        return None
    packed = [m.packed for m in linears]
    fused = PackedWeight(*(torch.cat([getattr(p, name) for p in packed]) for name in PackedWeight.TENSORS),
                         bits=packed[0].bits, group=packed[0].group)
    biases = [m.bias for m in linears]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else torch.zeros(m.out_features) for b, m in zip(biases, linears)])
    start = 0
    for module, part in zip(linears, packed):
        tiles = part.scale.shape[0]
        for name, tensor in fused.tiles(slice(start, start + tiles)).tensors().items():
            setattr(module, f"w_{name}", tensor)
        start += tiles
    return LowBitLinear(fused, bias)

