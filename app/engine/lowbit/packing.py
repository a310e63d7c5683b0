"""Low-bit weights: the packed layout the CPU kernel reads, and the pure-torch reference.

A weight [N, K] is stored as unsigned integers q (2, 3, 4, 5, 6 or 8 bits) with a scale and a min
per group of `group` inputs: w = scale * q - min. Symmetric weights (w = scale * (q - 2^(bits-1)):
6 bits always, as GGUF's Q6_K; 3 bits in groups of 16 as Q3_K; plain 4, 5 and 8 bits as Q4_0,
Q5_0 and Q8_0) store no min.
4-bit integers may also stand for 16 chosen 8-bit values (a table per tile, as GGUF's non-linear
IQ4_NL and IQ4_XS): w = scale * (values[q] - 128), symmetric.

Each group's scale and min are either float16 ("plain" parameters: 8 bits, and 4 or 5 bits in
groups of 32, as GGUF's Q4_0, Q4_1, Q5_0 and Q5_1 blocks store them: 4.5 to 6 bits per weight), or
int8 codes times a float16 step per super-block of groups (256 inputs where K allows), as GGUF's
K-quants store them ("coded": 2 to 6 bits, where float16 would cost a whole bit per weight:
3.125 bits per weight for 2-bit groups of 16, 3.5625 for symmetric 3-bit groups of 16, 3.625 for
3-bit groups of 32, 4.625 for 4-bit groups of 32, 5.625 for 5-bit groups of 32, 6.5625 for 6-bit
groups of 16). GGUF's Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 blocks are all
of these forms, so they repack
without changing a single weight (see gguf_weights.py); float weights are quantized into the
coded forms (8 bits: plain; 3 bits, a cheaper draft's feed-forward layers).

Activations are quantized to int8 per row and per group (a step of max|x| / 127), so the
product of one row never depends on the other rows in the batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TILE = 16  # outputs per tile: one 64-byte vector holds 16 outputs x 4 inputs
ROWS_MULTIPLE = 2 * TILE  # the kernel works on pairs of tiles; weights are padded with zero rows
ALWAYS_SYMMETRIC = (6,)  # bits whose weights store no min: the integer 2**(bits-1) stands for 0
CODED_BITS = (2, 3, 4, 5, 6)  # may hold scales and mins as int8 codes times a float16 step per super-block
PLAIN_BITS = (4, 5, 8)  # may hold them as float16 per group (4 and 5 bits: groups of 32 only)
CODE_MAX = 127


@dataclass
class PackedWeight:
    # uint8 [N/16, K/unit, lines, 16, 4] in units of lines of `unit` inputs (layout_unit: the
    # group, but for 3 bits always 32: two groups of 16 share theirs); lines = chunks (8-bit),
    # chunks/4 (2-bit), 3*chunks/8 (3-bit), chunks/2 (4-bit), 5*chunks/8 (5-bit), 3*chunks/4 (6-bit)
    q: torch.Tensor
    scale: torch.Tensor  # [N/16, K/group, 16]: float16 (plain) or int8 codes (coded)
    min: torch.Tensor  # as scale; [N/16, K/group, 0] when symmetric
    scale_step: torch.Tensor  # float16 [N/16, K/super-block, 16]: what a scale code of 1 stands for ([.., 0, 16] when plain)
    min_step: torch.Tensor  # float16 as scale_step, for the min codes (empty for 8 and 6 bits)
    values: torch.Tensor  # uint8 [N/16, 16]: the 8-bit value each 4-bit integer stands for; [N/16, 0]: the integer itself
    bits: int  # 2, 3, 4, 5, 6 or 8
    group: int  # 16 or 32 inputs per scale

    TENSORS = ("q", "scale", "min", "scale_step", "min_step", "values")

    @property
    def out_features(self) -> int:
        return self.scale.shape[0] * TILE

    @property
    def coded(self) -> bool:
        """Scales and mins as int8 codes times a step per super-block (else float16 per group)."""
        return self.scale.dtype == torch.int8

    @property
    def symmetric(self) -> bool:
        """No min stored: w = scale * (value - 2**(value_bits - 1))."""
        return self.min.shape[2] == 0

    @property
    def mapped(self) -> bool:
        """The 4-bit integers stand for values from a table."""
        return self.values.shape[1] > 0

    @property
    def value_bits(self) -> int:
        """The width of the values the integers stand for (8 through a table, else `bits`)."""
        return 8 if self.mapped else self.bits

    @property
    def in_features(self) -> int:
        return self.scale.shape[1] * self.group

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.TENSORS}

    @staticmethod
    def joined(parts: list[PackedWeight]) -> PackedWeight:
        """The weights of consecutive output rows as one; every part but the last holds a
        multiple of ROWS_MULTIPLE rows (only a whole weight's end is padded)."""
        if len(parts) == 1:
            return parts[0]
        if any(part.out_features % ROWS_MULTIPLE for part in parts[:-1]):
            raise ValueError(f"only the last part may hold rows beyond a multiple of {ROWS_MULTIPLE}")
        return PackedWeight(*(torch.cat([getattr(part, name) for part in parts]) for name in PackedWeight.TENSORS),
                            bits=parts[0].bits, group=parts[0].group)

    def tiles(self, index) -> PackedWeight:
        """The weight of some output tiles (index: a slice or tile indices)."""
        return PackedWeight(*(t[index] for t in self.tensors().values()), bits=self.bits, group=self.group)


def layout_unit(bits: int, group: int) -> int:
    """The inputs one unit of lines covers: the group, but 32 for 3 bits, whose top bits fill a
    line only for 8 chunks (two groups of 16 share a unit, the second's chunks after the first's)."""
    return 32 if bits == 3 else group


def super_block_groups(in_features: int, group: int) -> int:
    """Groups per super-block: 256 inputs as GGUF's K-quants, or fewer where K is not a multiple."""
    return math.gcd(in_features, 256) // group  # K is a multiple of the group, a power of two


def pack(q: torch.Tensor, scale: torch.Tensor, min_: torch.Tensor | None, bits: int, group: int,
         scale_step: torch.Tensor | None = None, min_step: torch.Tensor | None = None,
         values: torch.Tensor | None = None) -> PackedWeight:
    """q [N, K] integers in [0, 2**bits) -> the kernel's layout (N padded with zero rows to a
    multiple of 32). Plain (no steps: 8 bits, 4 and 5 bits in groups of 32): scale, min_
    [N, K/group] float. Coded (2 to 6 bits; 3 and 5 in groups of 32): scale, min_ [N, K/group]
    int8 codes and scale_step, min_step [N, K/(group * super_block_groups)] float. Symmetric (6 bits; plain 4, 5
    and 8 bits on request): min_ and min_step None. values: 16 uint8 values the 4-bit integers
    stand for (symmetric weights in groups of 32 only: w = scale * (values[q] - 128))."""
    coded = scale_step is not None
    if values is not None and (bits != 4 or min_ is not None or group != 32 or values.shape != (16,)):
        raise ValueError("a table of 16 values is for symmetric 4-bit weights in groups of 32")
    if bits in ALWAYS_SYMMETRIC and min_ is not None:
        raise ValueError(f"{bits}-bit weights have no min")
    if coded and min_ is None and bits not in ALWAYS_SYMMETRIC and values is None and (bits, group) != (3, 16):
        raise ValueError(f"{bits}-bit weights need a min")
    if (bits, group) == (3, 16) and min_ is not None:
        raise ValueError("3-bit weights in groups of 16 are symmetric (GGUF's Q3_K)")
    if bits not in (CODED_BITS if coded else PLAIN_BITS):
        raise ValueError(f"{bits}-bit weights {'have no' if coded else 'need'} steps per super-block")
    n, k = q.shape
    if k % layout_unit(bits, group) or group not in (16, 32) or (bits == 5 and group != 32) \
            or (not coded and bits < 8 and group != 32):
        raise ValueError(f"cannot pack a [{n}, {k}] weight in {bits} bits with groups of {group}"
                         f"{'' if coded else ' and float16 scales'}")
    if int(q.max()) >= 1 << bits or int(q.min()) < 0:
        raise ValueError(f"values do not fit in {bits} unsigned bits")
    pad = -n % ROWS_MULTIPLE
    padded = lambda t: None if t is None else torch.cat([t, t.new_zeros(pad, t.shape[1])]) if pad else t
    q, scale, min_, scale_step, min_step = map(padded, (q, scale, min_, scale_step, min_step))
    n += pad
    unit = layout_unit(bits, group)
    tiled = q.to(torch.uint8).reshape(n // TILE, TILE, k // unit, unit // 4, 4).permute(0, 2, 3, 1, 4)
    if bits < 8:  # the low bits of chunk (8 / low) p + j in line p from bit j * low, then the top bits alike
        low = _low_bits(bits)
        lines = [_bit_fields(tiled & ((1 << low) - 1), low)]
        if bits > low:
            lines.append(_bit_fields(tiled >> low, bits - low))
        tiled = torch.cat(lines, dim=2)
    per_tile = lambda t, dtype: (torch.empty(n // TILE, k // group, 0, dtype=dtype) if t is None else
                                 t.reshape(n // TILE, TILE, -1).transpose(1, 2).to(dtype).contiguous())
    table = (torch.empty(n // TILE, 0, dtype=torch.uint8) if values is None else
             values.to(torch.uint8).expand(n // TILE, 16).contiguous())
    if coded:
        for codes in (scale, min_):
            if codes is not None and (codes.abs() > CODE_MAX).any():
                raise ValueError(f"scale and min codes must lie within +-{CODE_MAX}")
        steps = k // group // super_block_groups(k, group)
        if scale_step.shape[1] != steps or (min_step is not None and min_step.shape[1] != steps):
            raise ValueError(f"a [{n}, {k}] weight in groups of {group} has {steps} super-blocks per row")
        return PackedWeight(tiled.contiguous(), per_tile(scale, torch.int8), per_tile(min_, torch.int8),
                            per_tile(scale_step, torch.float16),
                            per_tile(min_step, torch.float16) if min_step is not None else
                            torch.empty(n // TILE, steps, 0, dtype=torch.float16), table, bits, group)
    no_steps = torch.empty(n // TILE, 0, TILE, dtype=torch.float16)
    return PackedWeight(tiled.contiguous(), per_tile(scale, torch.float16), per_tile(min_, torch.float16),
                        no_steps, no_steps, table, bits, group)


def _low_bits(bits: int) -> int:
    """Below 8 bits, the bits of each integer kept in the first lines (the rest follow): a nibble,
    or a bit pair for 2 and 3 bits."""
    return 4 if bits >= 4 else 2


def _bit_fields(chunks: torch.Tensor, width: int) -> torch.Tensor:
    """chunks [T, G, C, 16, 4] of `width`-bit values -> lines [T, G, C * width / 8, 16, 4]: chunk
    (8 / width) p + j in line p, from bit j * width."""
    per_line = 8 // width
    fields = chunks.reshape(*chunks.shape[:2], -1, per_line, *chunks.shape[3:])
    line = fields[:, :, :, 0]
    for j in range(1, per_line):
        line = line | (fields[:, :, :, j] << (j * width))
    return line


def _fields(lines: torch.Tensor, width: int) -> torch.Tensor:
    """The inverse of _bit_fields: lines [T, G, L, 16, 4] -> chunks [T, G, L * 8 / width, 16, 4]."""
    mask = (1 << width) - 1
    return torch.stack([(lines >> shift) & mask for shift in range(0, 8, width)], dim=3).flatten(2, 3)


def unpack(weight: PackedWeight) -> torch.Tensor:
    """The packed integers back as q [N, K] uint8."""
    tiles, groups = weight.scale.shape[:2]
    tiled = weight.q
    if weight.bits < 8:
        low = _low_bits(weight.bits)
        low_lines = layout_unit(weight.bits, weight.group) // 4 * low // 8
        values = _fields(tiled[:, :, :low_lines], low)
        if weight.bits > low:
            values = values | (_fields(tiled[:, :, low_lines:], weight.bits - low) << low)
        tiled = values
    return tiled.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, groups * weight.group)


def integer_values(weight: PackedWeight) -> torch.Tensor:
    """The values the packed integers stand for, [N, K] uint8: the integers, or their table's entries."""
    q = unpack(weight)
    if not weight.mapped:
        return q
    return torch.gather(weight.values.repeat_interleave(TILE, dim=0), 1, q.long()).to(torch.uint8)


def group_params(weight: PackedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """scale, min as float32 [N, K/group] (code times step, one float32 product, as the kernel)."""
    as_rows = lambda t: t.float().transpose(1, 2).reshape(weight.out_features, -1).contiguous()
    scale, min_ = as_rows(weight.scale), as_rows(weight.min) if weight.min.shape[2] else None
    if weight.coded:
        repeat = super_block_groups(weight.in_features, weight.group)
        scale = scale * as_rows(weight.scale_step).repeat_interleave(repeat, dim=1)
        if min_ is not None:
            min_ = min_ * as_rows(weight.min_step).repeat_interleave(repeat, dim=1)
    return scale, (2 ** (weight.value_bits - 1) * scale if weight.symmetric else min_)


def dequantize(weight: PackedWeight) -> torch.Tensor:
    """The float weight [N, K] the packed integers stand for."""
    scale, min_ = group_params(weight)
    q = integer_values(weight).float().view(weight.out_features, -1, weight.group)
    return (scale[..., None] * q - min_[..., None]).view(weight.out_features, weight.in_features)


def _codes(values: torch.Tensor, groups_per_step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """values [N, G] -> codes [N, G] int8 and steps [N, G/groups_per_step] float16 with
    code * step >= value (rounded up: a scale never shrinks below what its group needs), up to
    the float16 rounding of the step for the largest value of a super-block."""
    n, g = values.shape
    per_step = values.reshape(n, g // groups_per_step, groups_per_step)
    step = (per_step.abs().amax(dim=-1) / CODE_MAX).to(torch.float16).float()
    safe = torch.where(step > 0, step, torch.ones_like(step))
    codes = torch.ceil(per_step / safe[..., None]).clamp(-CODE_MAX, CODE_MAX)
    return codes.reshape(n, g).to(torch.int8), step


def _half_at_least(values: torch.Tensor) -> torch.Tensor:
    """The float16 values nearest to `values` that are not below them, as float32."""
    half = values.to(torch.float16)
    up = torch.nextafter(half, torch.full_like(half, float("inf")))
    return torch.where(half.float() < values, up, half).float()


def quantize_float(weight: torch.Tensor, bits: int, group: int = 32, coded: bool | None = None,
                   symmetric: bool | None = None, values: torch.Tensor | None = None) -> PackedWeight:
    """A float weight [N, K] into `bits`-bit groups (min-max, rounded to nearest; or symmetric
    around the offset: 6 bits always, plain 4, 5 and 8 bits on request). coded: scales and mins
    as codes (the default for 4, 5 and 6 bits) or float16 (8 bits; 4 and 5 bits on request).
    values: 16 uint8 values, sorted, for 4-bit integers to stand for (w = scale * (value - 128));
    each weight takes the nearest."""
    coded = bits in CODED_BITS if coded is None else coded
    symmetric = bits in ALWAYS_SYMMETRIC if symmetric is None else symmetric
    if values is not None:
        return _quantize_to_values(weight, group, coded, values)
    n, k = weight.shape
    grouped = weight.detach().float().reshape(n, k // group, group)
    levels = (1 << bits) - 1
    per_step = super_block_groups(k, group)
    if symmetric:
        offset = 2 ** (bits - 1)
        stored, scale_step, scale = _scales_reaching(grouped.abs().amax(dim=-1) / (offset - 1), per_step, coded)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(grouped / safe[..., None]).clamp(-offset, offset - 1) + offset
        return pack(q.reshape(n, k), stored, None, bits, group, scale_step)
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    if coded:
        # The min first (rounded up: the grid starts at or below the group's lowest value), then
        # the scale that reaches the group's highest value from there.
        min_codes, min_step = _codes(-low, per_step)
        min_ = min_codes.float() * min_step.repeat_interleave(per_step, dim=1)
        scale_codes, scale_step = _codes((high + min_) / levels, per_step)
        scale = scale_codes.float() * scale_step.repeat_interleave(per_step, dim=1)
    else:  # float16 scale and min, both rounded outwards as the codes are
        min_ = _half_at_least(-low)
        scale = _half_at_least((high + min_) / levels)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((grouped + min_[..., None]) / safe[..., None]).clamp(0, levels).reshape(n, k)
    if coded:
        return pack(q, scale_codes, min_codes, bits, group, scale_step, min_step)
    return pack(q, scale, min_, bits, group)


def _scales_reaching(largest: torch.Tensor, per_step: int, coded: bool):
    """Scales at least `largest` [N, G]: what is stored (int8 codes or float16 values), the codes'
    steps (None when plain) and the scales as float32 [N, G]."""
    if not coded:
        scale = _half_at_least(largest)
        return scale, None, scale
    codes, step = _codes(largest, per_step)
    return codes, step, codes.float() * step.repeat_interleave(per_step, dim=1)


def _quantize_to_values(weight: torch.Tensor, group: int, coded: bool, values: torch.Tensor) -> PackedWeight:
    n, k = weight.shape
    grouped = weight.detach().float().reshape(n, k // group, group)
    points = values.float() - 128  # what each integer stands for, in steps of the scale
    largest = grouped.abs().amax(dim=-1) / min(-points.min(), points.max())  # both signs within reach
    stored, scale_step, scale = _scales_reaching(largest, super_block_groups(k, group), coded)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((grouped / safe[..., None])[..., None] - points).abs().argmin(dim=-1)
    return pack(q.reshape(n, k), stored, None, 4, group, scale_step, values=values)


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
    q = integer_values(weight).to(torch.int32).view(weight.out_features, -1, weight.group)
    groups = q_act.view(x.shape[0], -1, weight.group).to(torch.int32)
    dots = torch.einsum("ngk,mgk->mng", q, groups).float()  # exact: integer sums
    return (dots * scale[None] * step[:, None] - min_[None] * scaled_sum[:, None]).sum(dim=-1)
