"""A GGUF file's header parsed once, and faster; gguf's tensor-name map built once.

gguf's GGUFReader walks the whole header in Python through np.memmap, whose per-slice Python
hooks cost about 40% of that walk, and it reads an array one element at a time through several
calls (a Qwen2 vocabulary's 300k strings: 6-7 s per file here); and transformers parses the same
file again for the config. `parse(path)` reads arrays in one loop each, into the same parts, over
a plain array view of the file; `shared_reader(path)` parses it once and lends that reader to every
`gguf.GGUFReader(path)` made inside the block (transformers imports the class from the gguf
package when it reads a config).
Model loading runs one load at a time (model_pool.py), so the swaps are never seen by another
load.
"""
from __future__ import annotations

import functools
import mmap
import struct
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf
import gguf.gguf_reader
import numpy as np
from gguf import GGUFValueType

from . import gguf_check


class _PlainMapNumpy(types.ModuleType):
    """numpy as gguf's reader module sees it, with memmap giving a plain read-only array over
    the mapped file (the same bytes, without np.memmap's Python hooks on every slice)."""

    def __init__(self) -> None:
        super().__init__("numpy")

    def __getattr__(self, name: str):
        return getattr(np, name)

    @staticmethod
    def memmap(path, mode: str = "r") -> np.ndarray:  # parse() opens read-only
        with open(path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(mapped, dtype=np.uint8)


@contextmanager
def _lent(module: types.ModuleType, name: str, value) -> Iterator[None]:
    """module.name is `value` inside the block, and what it was again after it."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


class _ArraysAtOnce(gguf.GGUFReader):
    """GGUFReader whose arrays of strings and scalars are read in one loop each, into the parts
    GGUFReader makes (per string its length and its bytes, per scalar a one-element array): what
    reads a field (gguf's `contents`, transformers' parsing) sees the same thing."""

    _length = struct.Struct("=Q").unpack_from  # byte order 'I': the file's order is the host's

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        data = self.data
        raw_itype = data[orig_offs : orig_offs + 4].view(np.uint32)
        count_part = data[orig_offs + 4 : orig_offs + 12].view(np.uint64)
        item_type, count = GGUFValueType(int(raw_itype[0])), int(count_part[0])
        item_dtype = self.gguf_scalar_to_np.get(item_type)
        if item_type != GGUFValueType.STRING and item_dtype is None:  # arrays of arrays: rare and small
            return super()._get_field_parts(orig_offs, raw_type)
        parts, offs = [raw_itype, count_part], orig_offs + 12
        if item_type == GGUFValueType.STRING:
            raw = data.data
            for _ in range(count):
                (length,) = self._length(raw, offs)
                parts += (data[offs : offs + 8].view(np.uint64), data[offs + 8 : offs + 8 + length])
                offs += 8 + length
            data_indices = list(range(3, len(parts), 2))
        else:
            size = np.dtype(item_dtype).itemsize
            items = data[offs : offs + size * count].view(item_dtype)
            parts += (items[i : i + 1] for i in range(count))
            offs += size * count
            data_indices = list(range(2, len(parts)))
        types = [GGUFValueType.ARRAY, item_type] if count else [GGUFValueType.ARRAY]
        return offs - orig_offs, parts, data_indices, types


def parse(path: Path) -> gguf.GGUFReader:
    """GGUFReader(path), with the same fields and tensors, in a fraction of the time; a file whose
    structure does not hold is refused first (ModelError), before gguf's reader trusts it: every
    read of a GGUF's header goes through here (or, for a tokenizer alone, through gguf_check)."""
    gguf_check.check(path)
    with _lent(gguf.gguf_reader, "np", _PlainMapNumpy()):
        return _ArraysAtOnce(path)


@contextmanager
def shared_reader(path: Path) -> Iterator[gguf.GGUFReader]:
    """The parsed file; inside the block, GGUFReader(path) returns it instead of parsing again."""
    reader = parse(path)
    original = gguf.GGUFReader
    target = Path(path).resolve()

    def reader_for(other, mode="r"):
        return reader if mode == "r" and Path(other).resolve() == target else original(other, mode)

    with _lent(gguf, "GGUFReader", reader_for):
        yield reader


@contextmanager
def tensor_name_map_built_once() -> Iterator[None]:
    """transformers' get_gguf_hf_weights_map walks the module tree and builds gguf's name map
    afresh at every module (371 times for the default target: about 4 s of a first start); the
    map depends only on its arguments."""
    with _lent(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        yield
