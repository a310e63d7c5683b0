"""A model that cannot fit this machine's memory is refused before it loads.

Loading one anyway ends with the process killed by the system (or the machine swapping for
minutes): a 32B GGUF on a 16 GB laptop, or a 7B at float32 (28 GB, the reference precision).
The estimate is the memory the load needs at its peak:
- a GGUF at low bit: its file's size (the kernel's layout is within 3% of the file's blocks),
  1.35 times that the first time, while its blocks are repacked;
- float32 (and int8, which is quantized from it): 4 bytes per weight;
- a model folder at low bit: (bits + 1) / 8 bytes per weight (the integers, and a float16 scale and
  min per group of 32), 1.2 times that on its first start, while it is quantized a few rows at a
  time and stored (a 7B-shaped bf16 folder at 8 bits: 8.0 GiB estimated, 9.6 on the first start).
Only a model that cannot fit even with nothing else running is refused: the memory other
programs hold now may be given back, and the system may swap some. The pair is checked as one:
a model's need counts the other model's memory, already taken.

A request's caches are checked against the memory left now (check_caches_fit): they grow with
every token, and a long prompt (a pasted file, a 128k-token context) would otherwise end in the
system's out-of-memory killer halfway through its reading.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from .choices import Precision
from .errors import ModelError, PromptTooLongError

RESERVE = 1.5 * 2**30  # the system, the app itself (Python, torch, Qt) and the other model's buffers
REPACK_PEAK = 1.35
QUANTIZING_PEAK = 1.2
WORKSPACE = 256 * 2**20  # a pass's activations and buffers beside the caches


def check_fits(name: str, path: Path | None, size: int | None, precision: Precision, prepared: bool,
               held: int = 0) -> None:
    """Raises ModelError when `name` needs more memory than this machine has in all. path: the GGUF
    file or model folder (None: unknown, e.g. a hub id: not checked); size: a packaged GGUF's size
    when its file is not assembled yet; prepared: a low-bit copy is already stored (no repacking);
    held: what the models already loaded beside it take (the pair's other model)."""
    need, why = needed_bytes(path, size, precision, prepared)
    if need is None:
        return
    total = _total_memory()
    if need + held + RESERVE > total:
        beside = f", beside the {held / 2**30:.1f} GiB the other model takes," if held else ","
        raise ModelError(
            f"{name} needs about {need / 2**30:.1f} GiB of memory {why}{beside} and this machine has "
            f"{total / 2**30:.1f} GiB in all (about {RESERVE / 2**30:.1f} GiB of it goes to the system and the "
            "app). Pick a smaller model" + (", or the low-bit precision for this one." if not precision.low_bit else ".")
        )


def check_caches_fit(tokens: int, bytes_per_token: int) -> None:
    """Raises PromptTooLongError, as for a prompt longer than the context, when caches holding
    `tokens` tokens (at bytes_per_token for all the models together) do not fit the memory left."""
    need, left = tokens * bytes_per_token + WORKSPACE, memory_left()
    if need > left:
        raise PromptTooLongError(
            f"The prompt and the answer's room ({tokens:,} tokens) need about {need / 2**30:.1f} GiB of memory for "
            f"the models' caches, and {left / 2**30:.1f} GiB are free now; shorten the conversation, start a new "
            "chat, or lower the answer's length.")


def cache_bytes_per_token(config, element_bytes: int) -> int:
    """The keys and values one token adds to a model's cache, every layer's."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * element_bytes


def memory_left() -> int:
    """The bytes this process may still take: the system's available memory, or less where a limit
    on the process's address space (RLIMIT_AS) or its control group's memory (cgroup v2) leaves less."""
    import psutil

    left = psutil.virtual_memory().available
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            left = min(left, limit - psutil.Process().memory_info().vms)
    except (ImportError, OSError, ValueError):
        pass
    group = _control_group_room()
    return max(0, left if group is None else min(left, group))


def _control_group_room() -> int | None:
    try:
        line = next(entry for entry in Path("/proc/self/cgroup").read_text().splitlines() if entry.startswith("0::"))
        folder = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((folder / "memory.current").read_text())
    except (OSError, StopIteration, ValueError):
        return None


def needed_bytes(path: Path | None, size: int | None, precision: Precision, prepared: bool) -> tuple[int | None, str]:
    """(bytes at the load's peak, what they are for), or (None, "") when they cannot be told."""
    gguf = size is not None or (path is not None and path.suffix.lower() == ".gguf" and path.is_file())
    if gguf and precision.low_bit:
        file_size = size if size is not None else path.stat().st_size
        if prepared:
            return file_size, "at low bit"
        return int(file_size * REPACK_PEAK), "while its first start repacks it"
    weights = None
    if gguf and path is not None:
        weights = _gguf_weights(path)
    elif path is not None and path.is_dir():
        weights = _folder_weights(path)
        if weights is not None and precision.low_bit:
            bits = max(b for b in precision.requantized_bits if b) if any(precision.requantized_bits) else 8
            need = weights * (bits + 1) / 8
            if prepared:
                return int(need), f"at {bits} bits"
            return int(need * QUANTIZING_PEAK), f"while its first start quantizes it to {bits} bits"
    if weights is None:
        return None, ""
    return 4 * weights, f"to read its {weights / 1e9:.1f} billion weights as float32"


def _gguf_weights(path: Path) -> int | None:
    from .lowbit.gguf_file import parse

    try:
        return sum(int(tensor.n_elements) for tensor in parse(path).tensors)
    except ModelError:  # refused by the structural check: said now
        raise
    except Exception:  # otherwise damaged: reported by its load
        return None


def _folder_weights(folder: Path) -> int | None:
    """Weights in a folder's safetensors files, from their headers alone."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    try:
        for file in files:
            with open(file, "rb") as handle:
                header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
            total += sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return total


def _total_memory() -> int:
    import psutil

    return psutil.virtual_memory().total
