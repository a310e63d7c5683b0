"""Low-bit weights: the packed layout the CPU kernel reads, and the pure-torch reference.

A weight [N, K] is stored as unsigned integers q (4, 6 or 8 bits) with a scale and a min per
group of `group` inputs: w = scale * q - min. 6-bit weights are symmetric (w = scale * (q - 32),
as GGUF's Q6_K): their min is 32 * scale and is not stored, which keeps them at 7 bits per
weight in groups of 16. GGUF's Q4_K, Q5_0, Q6_K and Q8_0 blocks are all of these forms, so they
repack without changing a single weight (see gguf_weights.py); float weights are quantized into
them.

Activations are quantized to int8 per row and per group (a step of max|x| / 127), so the
product of one row never depends on the other rows in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TILE = 16  # outputs per tile: one 64-byte vector holds 16 outputs x 4 inputs
ROWS_MULTIPLE = 2 * TILE  # the kernel works on pairs of tiles; weights are padded with zero rows
SYMMETRIC_OFFSET = {6: 32}  # bits -> the integer that stands for 0 where the min is not stored


@dataclass
class PackedWeight:
    q: torch.Tensor  # uint8 [N/16, K/group, lines, 16, 4]: lines = chunks (8-bit), chunks/2 (4-bit), 3*chunks/4 (6-bit)
    scale: torch.Tensor  # float16 [N/16, K/group, 16]
    min: torch.Tensor  # float16 [N/16, K/group, 16]; [N/16, K/group, 0] when symmetric (6-bit)
    bits: int  # 4, 6 or 8
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


def pack(q: torch.Tensor, scale: torch.Tensor, min_: torch.Tensor | None, bits: int, group: int) -> PackedWeight:
    """q [N, K] integers in [0, 2**bits); scale, min_ [N, K/group] float (min_ None for the
    symmetric 6 bits) -> the kernel's layout (N padded with zero rows to a multiple of 32)."""
    if (min_ is None) != (bits in SYMMETRIC_OFFSET):
        raise ValueError(f"{bits}-bit weights {'have no' if bits in SYMMETRIC_OFFSET else 'need a'} min")
    pad = -q.shape[0] % ROWS_MULTIPLE
    if pad:
        q, scale = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (q, scale))
        min_ = None if min_ is None else torch.cat([min_, min_.new_zeros(pad, min_.shape[1])])
    n, k = q.shape
    if k % group or group not in (16, 32) or bits not in (4, 6, 8):
        raise ValueError(f"cannot pack a [{n}, {k}] weight in {bits} bits with groups of {group}")
    if int(q.max()) >= 1 << bits or int(q.min()) < 0:
        raise ValueError(f"values do not fit in {bits} unsigned bits")
    chunks = group // 4
    tiled = q.to(torch.uint8).reshape(n // TILE, TILE, k // group, chunks, 4).permute(0, 2, 3, 1, 4)
    if bits in (4, 6):  # low nibbles: chunk 2p in the low half of line p, chunk 2p+1 in the high half
        pairs = (tiled & 0x0F).reshape(n // TILE, k // group, chunks // 2, 2, TILE, 4)
        lines = [pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)]
        if bits == 6:  # then the top two bits of chunk 4h + j in bits 2j, 2j+1 of line h
            tops = (tiled >> 4).reshape(n // TILE, k // group, chunks // 4, 4, TILE, 4)
            lines.append(tops[:, :, :, 0] | (tops[:, :, :, 1] << 2) | (tops[:, :, :, 2] << 4) | (tops[:, :, :, 3] << 6))
        tiled = torch.cat(lines, dim=2)
    per_group = lambda t: t.reshape(n // TILE, TILE, k // group).transpose(1, 2).to(torch.float16).contiguous()
    stored_min = per_group(min_) if min_ is not None else torch.empty(n // TILE, k // group, 0, dtype=torch.float16)
    return PackedWeight(tiled.contiguous(), per_group(scale), stored_min, bits, group)


def unpack(weight: PackedWeight) -> torch.Tensor:
    """The packed integers back as q [N, K] uint8."""
    tiles, groups = weight.scale.shape[:2]
    tiled = weight.q
    if weight.bits in (4, 6):
        nibble_lines = weight.group // 8
        nibbles = tiled[:, :, :nibble_lines]
        low = torch.stack([nibbles & 0x0F, nibbles >> 4], dim=3).flatten(2, 3)
        if weight.bits == 6:
            tops = tiled[:, :, nibble_lines:]
            tops = torch.stack([(tops >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=3).flatten(2, 3)
            low = low | (tops << 4)
        tiled = low
    return tiled.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, groups * weight.group)


def group_params(weight: PackedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """scale, min as float32 [N, K/group]."""
    as_rows = lambda t: t.float().transpose(1, 2).reshape(weight.out_features, -1)
    scale = as_rows(weight.scale)
    offset = SYMMETRIC_OFFSET.get(weight.bits)
    return scale, (offset * scale if offset else as_rows(weight.min))


def dequantize(weight: PackedWeight) -> torch.Tensor:
    """The float weight [N, K] the packed integers stand for."""
    scale, min_ = group_params(weight)
    q = unpack(weight).float().view(weight.out_features, -1, weight.group)
    return (scale[..., None] * q - min_[..., None]).view(weight.out_features, weight.in_features)


def quantize_float(weight: torch.Tensor, bits: int, group: int = 32) -> PackedWeight:
    """A float weight [N, K] into `bits`-bit groups (min-max, rounded to nearest; symmetric
    around the offset for 6 bits)."""
    n, k = weight.shape
    grouped = weight.detach().float().reshape(n, k // group, group)
    offset = SYMMETRIC_OFFSET.get(bits)
    if offset:
        scale = (grouped.abs().amax(dim=-1) / (offset - 1)).to(torch.float16).float()
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(grouped / safe[..., None]).clamp(-offset, offset - 1) + offset
        return pack(q.reshape(n, k), scale, None, bits, group)
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
