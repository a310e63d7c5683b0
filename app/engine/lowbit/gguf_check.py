"""A GGUF file's structure checked against its own size before any reader trusts it.

gguf's reader (and transformers', built on it) takes every count, length and offset in the file
at its word: a 61-byte file claiming 2^40 array items makes it build views until the memory is
gone, and a tensor's offset past the end reads outside the mapping. This walk reads each field
once, with every count checked against the bytes left before it is used, and every tensor's
type, shape, offset and size checked against the file. It allocates nothing in proportion to a
claimed count, so a hostile file costs a bounded time and memory."""
from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import ModelError, in_one_line

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 40  # far beyond any model's tensor, far below what would overflow a byte count
MAX_NESTING = 2  # arrays of arrays (rare); deeper is no GGUF any writer makes
DEFAULT_ALIGNMENT = 32
SCALAR_SIZES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from


class _Damaged(Exception):
    """What is wrong, at which byte."""


class _Walk:
    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data, self.at, self.size = data, 0, len(data)

    def need(self, count: int, what: str) -> None:
        if count < 0 or count > self.size - self.at:
            raise _Damaged(f"{what}: {count:,} bytes from byte {self.at:,} on, but the file ends "
                           f"{self.size - self.at:,} bytes later")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32(self.data, self.at)
        self.at += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64(self.data, self.at)
        self.at += 8
        return value

    def string(self, what: str) -> bytes:
        length = self.u64(f"the length of {what}")
        self.need(length, what)
        value = self.data[self.at : self.at + length]
        self.at += length
        return value

    def value(self, kind: int, what: str, depth: int = 0):
        """Skips (or, for a scalar, reads) one value of `kind`."""
        if kind == GGUFValueType.STRING:
            return self.string(what)
        if kind == GGUFValueType.ARRAY:
            if depth >= MAX_NESTING:
                raise _Damaged(f"{what} nests arrays deeper than {MAX_NESTING}")
            item_kind = self.u32(f"the item type of {what}")
            count = self.u64(f"the item count of {what}")
            if item_kind in SCALAR_SIZES:
                self.need(count * SCALAR_SIZES[GGUFValueType(item_kind)], f"{what}'s {count:,} items")
                self.at += count * SCALAR_SIZES[GGUFValueType(item_kind)]
                return None
            if item_kind not in (GGUFValueType.STRING, GGUFValueType.ARRAY):
                raise _Damaged(f"{what} has items of unknown type {item_kind}")
            smallest = 8 if item_kind == GGUFValueType.STRING else 12
            self.need(count * smallest, f"{what}'s {count:,} items")  # before a loop of `count` turns
            if item_kind == GGUFValueType.STRING:  # a vocabulary: 150k strings and more, walked inline
                data, at, size = self.data, self.at, self.size
                for _ in range(count):
                    if at + 8 > size or at + 8 + _U64(data, at)[0] > size:
                        self.at = at
                        self.need(size + 1, f"a string of {what}")
                    at += 8 + _U64(data, at)[0]
                self.at = at
                return None
            for _ in range(count):
                self.value(item_kind, what, depth + 1)
            return None
        if kind not in SCALAR_SIZES:
            raise _Damaged(f"{what} has unknown type {kind}")
        size = SCALAR_SIZES[GGUFValueType(kind)]
        self.need(size, what)
        value = int.from_bytes(self.data[self.at : self.at + size], "little")
        self.at += size
        return value


def check(path: Path) -> None:
    """Raises ModelError, in one line, when `path` is not a GGUF file whose every field and tensor
    lies within it."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, 2)
            if size < 24:
                raise _Damaged(f"it holds {size} bytes, fewer than a GGUF header's 24")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                _check(_Walk(data))
    except _Damaged as damage:
        raise ModelError(f"{path} is not a readable GGUF file: {damage}") from None
    except OSError as error:
        raise ModelError(f"Cannot read {path}: {error.strerror or error}") from None


def _check(walk: _Walk) -> None:
    if walk.data[:4] != MAGIC:
        raise _Damaged("it does not start with GGUF's signature")
    walk.at = 4
    version = walk.u32("the version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        raise _Damaged("it is a big-endian GGUF, which SpecChat does not read" if swapped in VERSIONS
                       else f"GGUF version {version} (SpecChat reads versions 2 and 3)")
    tensor_count = walk.u64("the tensor count")
    field_count = walk.u64("the field count")
    walk.need(field_count * 13, f"{field_count:,} fields")  # a key's length, a type and one byte at least
    alignment = DEFAULT_ALIGNMENT
    for index in range(field_count):
        key = in_one_line(walk.string(f"field {index}'s name").decode("utf-8", "replace"), 80)
        kind = walk.u32(f"the type of field {key}")
        value = walk.value(kind, f"field {key}")
        if key == "general.alignment":
            if not isinstance(value, int) or value <= 0 or value & (value - 1) or value > 1 << 16:
                raise _Damaged(f"general.alignment is {value}, not a power of two up to 65536")
            alignment = value
    walk.need(tensor_count * 24, f"{tensor_count:,} tensor descriptions")
    tensors, names = [], set()
    for index in range(tensor_count):
        raw_name = walk.string(f"tensor {index}'s name")
        name = in_one_line(raw_name.decode("utf-8", "replace"), 80)
        if raw_name in names:
            raise _Damaged(f"tensor {name} is described twice")
        names.add(raw_name)
        dims = walk.u32(f"tensor {name}'s number of dimensions")
        if not 1 <= dims <= MAX_DIMS:
            raise _Damaged(f"tensor {name} has {dims} dimensions (1 to {MAX_DIMS} expected)")
        shape = [walk.u64(f"tensor {name}'s shape") for _ in range(dims)]
        kind = walk.u32(f"tensor {name}'s type")
        offset = walk.u64(f"tensor {name}'s offset")
        tensors.append((name, shape, kind, offset))
    data_start = -(-walk.at // alignment) * alignment
    for name, shape, kind, offset in tensors:
        elements = math.prod(shape)
        if min(shape) < 1 or elements > MAX_ELEMENTS:
            raise _Damaged(f"tensor {name} has shape {shape}")
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise _Damaged(f"tensor {name} has unknown type {kind}") from None
        if shape[0] % block:
            raise _Damaged(f"tensor {name}'s rows of {shape[0]} are not whole blocks of {block}")
        start, length = data_start + offset, elements // block * block_bytes
        if offset % alignment or start + length > walk.size:
            raise _Damaged(f"tensor {name}'s {length:,} bytes at byte {start:,} lie outside the file "
                           f"({walk.size:,} bytes) or off its {alignment}-byte alignment")
