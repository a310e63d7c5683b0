"""Low-bit weights: the packed layout the CPU kernel reads, and the pure-torch reference.

A weight [N, K] is stored as unsigned integers q (4 or 8 bits) with a scale and a min per
group of `group` inputs: w = scale * q - min. GGUF's Q4_K, Q5_0, Q6_K and Q8_0 blocks are all
of this form, so they repack without changing a single weight (see gguf_weights.py); float
weights are quantized into it.

Activations are quantized to int8 per row and per group (a step of max|x| / 127), so the
product of one row never depends on the other rows in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TILE = 16  # outputs per tile: one 64-byte vector holds 16 outputs x 4 inputs
ROWS_MULTIPLE = 2 * TILE  # the kernel works on pairs of tiles; weights are padded with zero rows


@dataclass
class PackedWeight:
    q: torch.Tensor  # uint8 [N/16, K/group, chunks (4-bit: chunks/2), 16, 4]
    scale: torch.Tensor  # float16 [N/16, K/group, 16]
    min: torch.Tensor  # float16 [N/16, K/group, 16]
    bits: int  # 4 or 8
    group: int  # 16 or 32 inputs per scale

    @property
    def out_features(self) -> int:
        return self.scale.shape[0] * TILE

    @property
    def in_features(self) -> int:
        return self.scale.shape[1] * self.group

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.min))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"q": self.q, "scale": self.scale, "min": self.min}


def pack(q: torch.Tensor, scale: torch.Tensor, min_: torch.Tensor, bits: int, group: int) -> PackedWeight:
    """q [N, K] integers in [0, 2**bits); scale, min_ [N, K/group] float -> the kernel's layout
    (N padded with zero rows to a multiple of 32)."""
    pad = -q.shape[0] % ROWS_MULTIPLE
    if pad:
        q, scale, min_ = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (q, scale, min_))
    n, k = q.shape
    if k % group or group not in (16, 32) or bits not in (4, 8):
        raise ValueError(f"cannot pack a [{n}, {k}] weight in {bits} bits with groups of {group}")
    if int(q.max()) >= 1 << bits or int(q.min()) < 0:
        raise ValueError(f"values do not fit in {bits} unsigned bits")
    chunks = group // 4
    tiled = q.to(torch.uint8).reshape(n // TILE, TILE, k // group, chunks, 4).permute(0, 2, 3, 1, 4)
    if bits == 4:  # chunk 2p in the low nibble, chunk 2p+1 in the high one
        pairs = tiled.reshape(n // TILE, k // group, chunks // 2, 2, TILE, 4)
        tiled = pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)
    per_group = lambda t: t.reshape(n // TILE, TILE, k // group).transpose(1, 2).to(torch.float16).contiguous()
    return PackedWeight(tiled.contiguous(), per_group(scale), per_group(min_), bits, group)


def unpack(weight: PackedWeight) -> torch.Tensor:
    """The packed integers back as q [N, K] uint8."""
    tiles, groups = weight.scale.shape[:2]
    tiled = weight.q
    if weight.bits == 4:
        tiled = torch.stack([tiled & 0x0F, tiled >> 4], dim=3).flatten(2, 3)
    return tiled.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, groups * weight.group)


def group_params(weight: PackedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """scale, min as float32 [N, K/group]."""
    as_rows = lambda t: t.float().transpose(1, 2).reshape(weight.out_features, -1)
    return as_rows(weight.scale), as_rows(weight.min)


def dequantize(weight: PackedWeight) -> torch.Tensor:
    """The float weight [N, K] the packed integers stand for."""
    scale, min_ = group_params(weight)
    q = unpack(weight).float().view(weight.out_features, -1, weight.group)
    return (scale[..., None] * q - min_[..., None]).view(weight.out_features, weight.in_features)


def quantize_float(weight: torch.Tensor, bits: int, group: int = 32) -> PackedWeight:
    """A float weight [N, K] into asymmetric `bits`-bit groups (min-max, rounded to nearest)."""
    n, k = weight.shape
    grouped = weight.detach().float().reshape(n, k // group, group)
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    levels = (1 << bits) - 1
    scale = ((high - low) / levels).to(torch.float16).float()
    min_ = (-low).to(torch.float16).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((grouped + min_[..., None]) / safe[..., None]).clamp(0, levels)
    return pack(q.reshape(n, k), scale, min_, bits, group)


def quantize_activations(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] float32 -> int8 values [M, K], step [M, K/group], step * group sum [M, K/group]."""
    rows, k = x.shape
    grouped = x.reshape(rows, k // group, group)
    amax = grouped.abs().amax(dim=-1)
    # Tensor-by-tensor divisions, as the kernel computes them: torch turns `127 / amax` into
    # `127 * (1 / amax)`, which rounds differently and can move a value to the next integer.
    levels = torch.full_like(amax, 127.0)
    step = amax / levels
    inverse = torch.where(amax > 0, levels / amax, torch.zeros_like(amax))
    q = torch.round(grouped * inverse[..., None])
    return q.to(torch.int8).reshape(rows, k), step, step * q.sum(dim=-1)


def reference_linear(x: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
    """x [M, K] float32 -> [M, N] float32: the kernel's arithmetic in plain torch (slow).

    Exact integer dot products per group, then float scaling row by row, so it is batch
    invariant too; it agrees with the kernel to float rounding."""
    q_act, step, scaled_sum = quantize_activations(x.float(), weight.group)
    scale, min_ = group_params(weight)
    q = unpack(weight).to(torch.int32).view(weight.out_features, -1, weight.group)
    groups = q_act.view(x.shape[0], -1, weight.group).to(torch.int32)
    dots = torch.einsum("ngk,mgk->mng", q, groups).float()  # exact: integer sums
    return (dots * scale[None] * step[:, None] - min_[None] * scaled_sum[:, None]).sum(dim=-1)
