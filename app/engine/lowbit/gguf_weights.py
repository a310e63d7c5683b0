"""GGUF quantized blocks -> (q, scale, min) groups, without dequantizing.

The common block formats are all `w = scale * q - min` per group:
  Q4_K  4-bit q, scale = d*sc, min = dmin*m per 32   -> 4 bits, groups of 32, codes sc and m, steps d and dmin
  Q5_K  5-bit q, the same scales                      -> 5 bits, groups of 32, the same codes and steps
  Q6_K  6-bit q, w = d*sc*(q-32) per 16               -> 6 bits (symmetric, no min), groups of 16, codes sc, step d
  Q3_K  3-bit q, w = d*sc*(q-4) per 16                -> 3 bits (symmetric), groups of 16, codes sc, step d
  Q2_K  2-bit q, w = d*sc*q - dmin*m per 16           -> 2 bits, groups of 16, codes sc and m, steps d and dmin
  Q4_0  4-bit q, w = d*(q-8) per 32                   -> 4 bits (symmetric), groups of 32, float16 scale d
  Q4_1  4-bit q, w = d*q + m per 32                   -> 4 bits, groups of 32, float16 scale d and min -m
  Q5_0  5-bit q, w = d*(q-16) per 32                  -> 5 bits (symmetric), groups of 32, float16 scale d
  Q5_1  5-bit q, w = d*q + m per 32                   -> 5 bits, groups of 32, float16 scale d and min -m
  Q8_0  int8 q, w = d*q per 32                        -> 8 bits (q+128, symmetric), groups of 32, float16 scale d
  IQ4_NL  4-bit index into 16 fixed values, w = d*v   -> 4 bits through the table (symmetric), groups of 32, float16 scale d
  IQ4_XS  the same values, w = d*(ls-32)*v per 32      -> 4 bits through the table, groups of 32, code ls-32, step d
Other types (the 1-, 2- and 3-bit IQ formats; float tensors) are dequantized and quantized to 8
bits, groups of 32.
Every one of these keeps the block's own integers, codes and float16 numbers, so the weights are
exact; the symmetric ones (w = scale * (q - 2^(bits-1))) store no min.
"""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import dequantize

from .packing import ROWS_MULTIPLE, PackedWeight, pack, quantize_float

REQUANTIZED_ROWS = 128 * ROWS_MULTIPLE  # rows dequantized and quantized afresh at a time

# q [N, K] uint8, scale, min [N, K/G] (float16 values, or codes for the K-quants), bits, G, then the
# codes' steps per super-block [N, K/256] (None for float16 values)
Groups = tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int, np.ndarray | None, np.ndarray | None]


def _half(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of a Q4_K/Q5_K block -> 6-bit scales and mins [blocks, 8]."""
    d, m, m_d = np.split(scales.reshape(-1, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(-1, 8).astype(np.float32), mn.reshape(-1, 8).astype(np.float32)


def _q4_k(blocks: np.ndarray) -> Groups:
    d, dmin = _half(blocks[:, 0:2]), _half(blocks[:, 2:4])
    sc, mn = _k_scales(blocks[:, 4:16])
    qs = blocks[:, 16:144].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (qs & 0x0F).reshape(-1, 256), sc, mn, 4, 32, d, dmin


def _q5_k(blocks: np.ndarray) -> Groups:
    d, dmin = _half(blocks[:, 0:2]), _half(blocks[:, 2:4])
    sc, mn = _k_scales(blocks[:, 4:16])
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    ql = blocks[:, 48:176].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (ql & 0x0F).reshape(-1, 8, 32) | ((qh & 0x01) << 4)
    return q.reshape(-1, 256), sc, mn, 5, 32, d, dmin


def _q2_k(blocks: np.ndarray) -> Groups:
    sc, mn = blocks[:, 0:16] & 0x0F, blocks[:, 0:16] >> 4
    q = (blocks[:, 16:80].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    return q.reshape(-1, 256), sc, mn, 2, 16, _half(blocks[:, 80:82]), _half(blocks[:, 82:84])


def _q3_k(blocks: np.ndarray) -> Groups:
    """Signed 6-bit scales; each value's third bit is set in hmask where it has no -4 offset."""
    packed = blocks[:, 96:108]
    low = (packed[:, 0:8].reshape(-1, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(-1, 16) & 0x0F
    high = (packed[:, 8:12].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(-1, 16) & 0x03
    sc = (low | (high << 4)).astype(np.int8) - 32
    ql = (blocks[:, 32:96].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    qh = (blocks[:, 0:32].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 0x01
    q = ql.reshape(-1, 256) | (qh.reshape(-1, 256) << 2)  # w = d*sc*(q-4): symmetric, scale d*sc
    return q, sc, None, 3, 16, _half(blocks[:, 108:110]), None


def _q6_k(blocks: np.ndarray) -> Groups:
    ql = blocks[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(-1, 8, 32)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & 0x03).reshape(-1, 8, 32)
    sc = blocks[:, 192:208].copy().view(np.int8)
    return (ql | (qh << 4)).reshape(-1, 256), sc, None, 6, 16, _half(blocks[:, 208:210]), None


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes per block of 32 -> the 4 low bits of each value: value j in the low nibble of
    byte j, value j + 16 in its high nibble."""
    return ((qs.reshape(-1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)) & 0x0F).reshape(-1, 32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes per block of 32 -> each value's fifth bit (bit j of the little-endian word), at bit 4."""
    bits = qh.copy().view(np.uint32).reshape(-1, 1) >> np.arange(32, dtype=np.uint32).reshape(1, 32)
    return (bits & 0x01).astype(np.uint8) << 4


def _q4_0(blocks: np.ndarray) -> Groups:
    d = _half(blocks[:, 0:2])
    return _nibbles(blocks[:, 2:18]), d, None, 4, 32, None, None


def _q4_1(blocks: np.ndarray) -> Groups:
    d, m = _half(blocks[:, 0:2]), _half(blocks[:, 2:4])
    return _nibbles(blocks[:, 4:20]), d, -m, 4, 32, None, None


def _q5_0(blocks: np.ndarray) -> Groups:
    d = _half(blocks[:, 0:2])
    return _nibbles(blocks[:, 6:22]) | _fifth_bits(blocks[:, 2:6]), d, None, 5, 32, None, None


def _q5_1(blocks: np.ndarray) -> Groups:
    d, m = _half(blocks[:, 0:2]), _half(blocks[:, 2:4])
    return _nibbles(blocks[:, 8:24]) | _fifth_bits(blocks[:, 4:8]), d, -m, 5, 32, None, None


# IQ4_NL's and IQ4_XS's values (ggml's kvalues_iq4nl), plus 128: what the kernel's table holds
IQ4_VALUES = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]) + 128


def _iq4_nl(blocks: np.ndarray) -> Groups:
    return _nibbles(blocks[:, 2:18]), _half(blocks[:, 0:2]), None, 4, 32, None, None


def _iq4_xs(blocks: np.ndarray) -> Groups:
    low = (blocks[:, 4:8].reshape(-1, 4, 1) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2)).reshape(-1, 8) & 0x0F
    high = (blocks[:, 2:4].copy().view(np.uint16).reshape(-1, 1) >> np.arange(0, 16, 2, dtype=np.uint16).reshape(1, 8)) & 0x03
    codes = (low | (high.astype(np.uint8) << 4)).astype(np.int8) - 32
    return _nibbles(blocks[:, 8:136].reshape(-1, 16)).reshape(-1, 256), codes, None, 4, 32, _half(blocks[:, 0:2]), None


def _q8_0(blocks: np.ndarray) -> Groups:
    d = _half(blocks[:, 0:2])
    q = (blocks[:, 2:34].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return q, d, None, 8, 32, None, None


DECODERS = {T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k, T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1,
            T.Q8_0: _q8_0, T.IQ4_NL: _iq4_nl, T.IQ4_XS: _iq4_xs}
TABLES = {T.IQ4_NL: IQ4_VALUES, T.IQ4_XS: IQ4_VALUES}  # the values 4-bit integers stand for


def packed_from_gguf(data: np.ndarray, qtype: T, shape: tuple[int, int], row_order: np.ndarray | None = None,
                     requantize_bits: int | None = None) -> PackedWeight:
    """data: the tensor's raw bytes [N, bytes per row]; shape (N, K).
    row_order: a permutation of the output rows (some architectures reorder q/k heads).
    requantize_bits: quantize the dequantized weight afresh instead (a draft may be cheaper)."""
    n, k = shape
    decoder = DECODERS.get(qtype)
    if decoder is None or requantize_bits is not None:
        # Some rows at a time: a whole matrix in float32 and quantize_float's temporaries of it (a
        # 151,936-token embedding: 545 MB, several times over) had raised a first start's peak
        # memory from 2.94 to 4.28 GiB. Each row is quantized on its own, so the result is the same.
        rows = np.arange(n) if row_order is None else row_order
        return PackedWeight.joined([
            quantize_float(torch.from_numpy(np.ascontiguousarray(
                dequantize(data[rows[first : first + REQUANTIZED_ROWS]], qtype).reshape(-1, k), dtype=np.float32)),
                requantize_bits or 8, 32)
            for first in range(0, n, REQUANTIZED_ROWS)])
    blocks = np.ascontiguousarray(data).reshape(n * k // _block_size(qtype), -1)
    q, scale, min_, bits, group, scale_step, min_step = decoder(blocks)
    order = slice(None) if row_order is None else row_order
    as_tensor = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a.reshape(n, -1)[order]))
    return pack(*map(as_tensor, (q, scale, min_)), bits, group, *map(as_tensor, (scale_step, min_step)),
                values=TABLES.get(qtype))


def _block_size(qtype: T) -> int:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qtype][0]
