"""A folder that holds a low-bit model: config, tokenizer, the packed tensors as safetensors and
which modules are low-bit. Later starts load it in seconds instead of re-reading the GGUF."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig, PreTrainedTokenizerBase

from ..files import written_whole
from ..models.shared_tokenizers import folder_tokenizer
from . import skeleton
from .memory import read_in_huge_pages
from .modules import LowBitEmbedding, LowBitLinear, _Packed, fuse_projections
from .packing import PackedWeight

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LAYOUT = "lowbit.json"
WEIGHTS = "lowbit.safetensors"
FORMAT = 11  # bump when the packed layout changes, so old caches are rebuilt (4: coded 4- and 6-bit scales; 5: Q5_K in 5 bits;
# 6: Q4_0, Q4_1, Q5_0 and Q5_1 in 4 and 5 bits; 7: Q4_0, Q5_0 and Q8_0 symmetric, no min stored, and
# IQ4_NL and IQ4_XS in 4 bits through a table of values; 8: Q2_K in 2 bits; 9: Q3_K in 3 bits; 10: Gemma 3's
# norms as the file means them and its embedding's scale, both lost before; 11: q/k/v and gate/up stored fused)


def is_complete(folder: Path) -> bool:
    try:
        return json.loads((folder / LAYOUT).read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    if skeleton.runs_lean(model.config):  # stored fused, so that a loaded model needs no copy
        fuse_projections(model.model.layers)
    sharing: dict[int, dict[str, _Packed]] = {}  # the packed modules by the storage of their integers
    for name, module in model.named_modules():
        if isinstance(module, _Packed):
            sharing.setdefault(module.w_q.untyped_storage().data_ptr(), {})[name] = module
    layout, tensors = {}, {}
    for group in sharing.values():
        for name, module in group.items():
            layout[name] = {"kind": type(module).__name__, "bits": module.bits, "group": module.group,
                            "out_features": getattr(module, "out_features", None),
                            "scale": getattr(module, "scalar_embed_scale", None), **_stored_as(name, group)}
    for name, tensor in model.state_dict().items():
        module_name, _, attribute = name.rpartition(".")
        if module_name in layout and layout[module_name]["weights_of"] != module_name and attribute.startswith("w_"):
            continue
        tensors[name] = tensor.contiguous()
    with written_whole(folder) as partial:
        model.config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        save_file(tensors, partial / WEIGHTS)
        (partial / LAYOUT).write_text(json.dumps({"format": FORMAT, "modules": layout}, indent=1))


def _whole(tensor: torch.Tensor) -> bool:
    return tensor.storage_offset() == 0 and tensor.nbytes == tensor.untyped_storage().nbytes()


def _stored_as(name: str, sharing: dict[str, _Packed]) -> dict:
    """Where a packed module's tensors are stored, among the modules sharing their storage: its own
    ({"weights_of": name}), those of a module holding the same tensors (tied weights: the first
    name stores them), or some tiles of a module holding the whole storage (a fused projection's
    part: {"weights_of": that module, "tiles": [first, end]})."""
    q = sharing[name].w_q
    for other_name, other in sharing.items():
        theirs = other.w_q
        if other_name == name:
            continue
        if theirs.storage_offset() == q.storage_offset() and theirs.shape == q.shape:
            if other_name < name:
                return {"weights_of": other_name}
        elif _whole(theirs):
            first = q.storage_offset() // theirs.stride(0)
            return {"weights_of": other_name, "tiles": [first, first + q.shape[0]]}
    return {"weights_of": name}


def load(folder: Path) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """The model (skeleton.CausalLM where LeanDecoder runs it, else transformers') and its tokenizer."""
    layout = json.loads((folder / LAYOUT).read_text())["modules"]
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    # What LeanDecoder runs loads without transformers' modeling code; every weight comes from the file.
    model = skeleton.CausalLM(config) if skeleton.can_build(config) else skeleton.empty_transformers_model(config)
    tensors = read_in_huge_pages(folder / WEIGHTS)
    for name, spec in layout.items():
        source = spec["weights_of"]
        packed = PackedWeight(*(tensors[f"{source}.w_{part}"] for part in PackedWeight.TENSORS), spec["bits"], spec["group"])
        if "tiles" in spec:  # a fused projection's part: a view of its tiles
            packed = packed.tiles(slice(*spec["tiles"]))
        bias = tensors.get(f"{name}.bias")
        module = LowBitEmbedding(packed, spec.get("scale")) if spec["kind"] == "LowBitEmbedding" else \
            LowBitLinear(packed, bias, spec["out_features"])
        model.set_submodule(name, module)
    for name, tensor in tensors.items():
        module_name, _, attribute = name.rpartition(".")
        if module_name in layout:
            continue
        module = model.get_submodule(module_name)
        if attribute in module._buffers:
            module._buffers[attribute] = tensor
        else:
            module._parameters[attribute] = nn.Parameter(tensor, requires_grad=False)
    missing = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if missing:
        raise ValueError(f"{folder} is incomplete (no {missing[0]})")
    skeleton.divide_rope_frequencies(model)
    return model.eval(), folder_tokenizer(folder)
