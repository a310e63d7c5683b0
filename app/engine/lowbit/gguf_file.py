"""A GGUF file's header parsed once, and faster, and what transformers needs of it.

gguf's GGUFReader walks the whole header in Python through np.memmap, whose per-slice Python
hooks cost about 40% of that walk, and it reads an array one element at a time through several
calls (a Qwen2 vocabulary's 300k strings: 6-7 s per file). `parse(path)` reads arrays in one loop
each, into the same parts, over a plain array view of the file. transformers would parse the same
file again for the config (`config_of` hands it the settings alone) and build gguf's tensor-name
map at every module (`hf_names` builds it once).
"""
from __future__ import annotations

import struct
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import gguf
import numpy as np
from gguf import GGUFValueType

from . import gguf_check

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig

# The tokenizer's arrays (its 150k tokens, scores, types, merges): what makes a header slow to read
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.merges")
# model types that gguf-py names otherwise (transformers' get_gguf_hf_weights_map renames them so)
GGUF_MODEL_TYPES = {"cohere": "command-r", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3",
                    "gemma4_text": "gemma4", "umt5": "t5", "minimax_m2": "minimax-m2", "gpt_oss": "gpt-oss"}


class FastReader(gguf.GGUFReader):
    """GGUFReader over a plain array view of the mapped file (the same bytes, without np.memmap's
    Python hooks on every slice), whose arrays of strings and scalars are read in one loop each,
    into the parts GGUFReader makes (per string its length and its bytes, per scalar a one-element
    array): what reads a field (gguf's `contents`, transformers' parsing) sees the same thing."""

    _length = struct.Struct("=Q").unpack_from  # byte order 'I': the file's order is the host's

    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.memmap) -> None:  # GGUFReader.__init__ sets it, then parses through it
        self._plain = mapped.view(np.ndarray)

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
    return FastReader(path)


def config_of(reader: gguf.GGUFReader, path: Path) -> PretrainedConfig:
    """transformers' config for the GGUF at `path`, parsed as `reader`. Given the file, transformers
    parses all of it again with gguf's own reader (seconds for a 150k-token vocabulary); it reads
    instead a copy of the header without the tokenizer's arrays and without tensors, written to a
    temporary folder, with the vocabulary's size (which it would count from those arrays) as a
    setting."""
    from transformers import AutoConfig

    architecture = str(reader.fields["general.architecture"].contents())
    with tempfile.TemporaryDirectory(prefix="specchat-gguf-") as folder:
        settings = Path(folder) / "settings.gguf"
        writer = gguf.GGUFWriter(settings, architecture)
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue  # the writer writes these itself
            if name in TOKENIZER_ARRAYS:
                continue
            array = field.types[0] == GGUFValueType.ARRAY
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[-1] if array else None)
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        if f"{architecture}.vocab_size" not in reader.fields and tokens is not None:
            writer.add_vocab_size(len(tokens.data))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        config = AutoConfig.from_pretrained(folder, gguf_file=settings.name, trust_remote_code=False)
    config._name_or_path = str(path.parent)  # as if read from the file itself
    return config


def hf_names(model: nn.Module, processor) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, as transformers' get_gguf_hf_weights_map
    maps them for the decoders we load, with gguf's name map built once (transformers builds it
    again at every module: 371 times for the default target)."""
    model_type = GGUF_MODEL_TYPES.get(model.config.model_type, model.config.model_type)
    arch = next((key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == model_type), None)
    if arch is None:
        raise NotImplementedError(f"gguf-py does not know the architecture {model_type}")
    name_map = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    names: dict[str, str] = {}
    for hf_name in model.state_dict():
        hf_name = processor.preprocess_name(hf_name)
        name, suffix = hf_name.rsplit(".", 1) if hf_name.endswith((".weight", ".bias")) else (hf_name, "")
        suffix = f".{suffix}" if suffix else ""
        gguf_name = name_map.get_name(name)
        if gguf_name is None:
            processor.perform_fallback_tensor_mapping(names, suffix, "", hf_name)
        else:
            names[gguf_name + suffix] = hf_name
    return names
