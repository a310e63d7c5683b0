"""The low-bit layers where the C++ kernel cannot run (an ARM Mac or Linux machine, an x86 CPU
without AVX2, a machine without a compiler): each one's weight dequantized and stored as int8 per
output row, run by torch's own dynamically quantized matmul (fbgemm on x86, QNNPACK on ARM).

The pure-torch reference of the kernel's arithmetic (packing.reference_linear) unpacks every
weight to int32 on every call: seconds per token. torch's int8 matmul was the fastest of torch's
own paths on the default target's layers here (float32 through oneDNN, bfloat16); `bench speed
--cpu-paths` measures the whole model beside the kernel and the fp32 reference. The answer is the
int8 target's own: speculative decoding stays exact against it (below), and it rounds otherwise
than the kernel and the fp32 reference.
"""
from __future__ import annotations

import functools
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from torch.nn import functional as F

from .cpu import cpu_flags
from .modules import FUSED, LowBitLinear
from .packing import dequantize

# torch quantizes a call's activations with one scale and zero point for all its rows, from the
# call's smallest and largest value: a row's product would depend on the rows beside it, and a
# verified token would round otherwise than decoded alone (a greedy near-tie could flip). Each row
# is divided by its largest magnitude and framed by a -1 and a 1 (two inputs whose weights are
# zero): every call's range is then [-1, 1], every row is quantized as it would be alone, the
# integer products are exact, and the row's product is the same whatever rows share its call.
FRAME = torch.tensor([[-1.0, 1.0]])


@functools.cache
def _reduce_range() -> bool:
    """Whether activations keep to 7 bits: x86's int8 products without VNNI add pairs into 16 bits,
    which full 8-bit activations can overflow (torch.ao's dynamic Linear always reduces; that costs a
    bit of precision wherever the overflow cannot happen: ARM's QNNPACK, x86 with VNNI)."""
    return torch.backends.quantized.engine in ("fbgemm", "x86") and not {"avx512_vnni", "avx_vnni"} & cpu_flags()


class Int8Linear(nn.Module):
    """What a LowBitLinear computes, from its weight dequantized and rounded to int8 per output row
    (a row's largest magnitude at 127), packed once for torch's dynamically quantized matmul; the
    activations are quantized per call, each row to its own scale (FRAME)."""

    def __init__(self, linear: LowBitLinear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = dequantize(linear.packed)[: linear.out_features]  # [out, in] float32
        scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
        codes = F.pad(torch.round(weight / scale[:, None]).to(torch.int8), (0, FRAME.shape[1]))  # zero weights for the frame
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notice that quantized tensors move to torchao
            rows = torch._make_per_channel_quantized_tensor(codes, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
        self.packed_weight = torch.ops.quantized.linear_prepack(rows, None)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)
        self.weight_bytes = codes.nbytes + scale.nbytes  # what the packed copy holds (model_bytes reads it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features).float()
        largest = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)  # [M, 1]
        framed = torch.cat([rows / largest, FRAME.expand(rows.shape[0], -1)], dim=1)
        out = torch.ops.quantized.linear_dynamic(framed, self.packed_weight, reduce_range=_reduce_range()) * largest
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 per row"


def run_without_kernel(model: nn.Module) -> int:
    """Replaces every low-bit linear layer of `model` in place; returns how many. The fused q/k/v and
    gate/up layers go first: their parts are replaced on their own, so the weights are held once.
    Layers convert on as many threads as torch computes on (torch's packing runs on one core: the
    default target's 197 layers took 34 s on one thread, 25 s on two), each thread's float copy of
    one layer at most in memory."""
    for layer in getattr(getattr(model, "model", None), "layers", []):
        for block_name, (fused_name, _) in FUSED.items():
            block = getattr(layer, block_name, None)
            if block is not None and hasattr(block, fused_name):
                delattr(block, fused_name)
    low_bit = [(parent, name, child) for parent in list(model.modules())
               for name, child in list(parent.named_children()) if isinstance(child, LowBitLinear)]
    with ThreadPoolExecutor(max(1, torch.get_num_threads()), thread_name_prefix="specchat-int8") as pool:
        for (parent, name, _), converted in zip(low_bit, pool.map(lambda item: Int8Linear(item[2]), low_bit)):
            setattr(parent, name, converted)
    return len(low_bit)
