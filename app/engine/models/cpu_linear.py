"""Faster linear layers on CPU: fp32 weights pre-packed for oneDNN, or int8 for drafts.

PyTorch's default fp32 CPU path (MKL sgemm) re-packs the weight on every call, which
dominates at the small batch sizes of decoding (1 to k+1 tokens). oneDNN with the weight
packed once is about twice as fast here, in the same float32 precision.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed_weight", linear.weight.detach().to_mkldnn(), persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        flat = x.reshape(-1, self.in_features).to_mkldnn()
        out = torch._C._nn.mkldnn_linear(flat, self.packed_weight, self.bias).to_dense()
        return out.view(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module) -> int:
    """Replace the fp32 nn.Linear layers of a CPU model in place; returns how many."""
    if not torch.backends.mkldnn.is_available():
        return 0
    tied = {id(p) for name, p in model.named_parameters() if "embed" in name}
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, nn.Linear) and child.weight.dtype == torch.float32
                    and child.weight.device.type == "cpu" and id(child.weight) not in tied):
                setattr(parent, name, PackedLinear(child))
                replaced += 1
    return replaced


def quantize_linears_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantization of every nn.Linear (weights int8 per tensor, activations
    quantized on the fly): about 3x faster than packed fp32 here, slightly approximate."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's notice that this API moves to torchao
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def model_bytes(model: nn.Module) -> int:
    """Bytes of weights: the memory the model's tensors occupy, each byte once (tied weights,
    fused low-bit weights viewed by several modules, tensors sharing one buffer: the store's
    huge-page buffer has gaps for alignment that hold nothing), packed oneDNN buffers and
    quantized tensors by their own size."""
    ranges: set[tuple[int, int]] = set()
    opaque: dict[int, int] = {}

    def collect(value) -> None:
        if isinstance(value, torch.Tensor) and value.numel() > 0:
            if value.is_mkldnn or value.is_quantized:
                opaque[id(value)] = value.numel() * value.element_size()
            else:
                ranges.add((value.data_ptr(), value.data_ptr() + value.numel() * value.element_size()))
        elif isinstance(value, (tuple, list)):
            for v in value:
                collect(v)

    for value in model.state_dict(keep_vars=True).values():
        collect(value)
    for buffer in model.buffers():
        if buffer.is_mkldnn:
            collect(buffer)
    for module in model.modules():  # torch's packed int8 weights are no tensors (lowbit/fallback)
        if hasattr(module, "weight_bytes"):
            opaque[id(module)] = module.weight_bytes
    total, end = 0, 0
    for first, last in sorted(ranges):  # the union of the ranges
        total += max(0, last - max(first, end))
        end = max(end, last)
    return total + sum(opaque.values())
