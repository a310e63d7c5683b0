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

On a GPU (check_float_load) a model is checked against the GPU's free memory at 2 bytes per weight
(bfloat16 or float16), the machine's memory that reads it first, and on a GGUF's first start the
disk its float32 copy takes (4 bytes per weight); a request's caches against the GPU's memory.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from . import devices
from .choices import Precision
from .errors import ModelError, PromptTooLongError

RESERVE = 1.5 * 2**30  # the system, the app itself (Python, torch, Qt) and the other model's buffers
REPACK_PEAK = 1.35
QUANTIZING_PEAK = 1.2
# Without the kernel (lowbit/fallback) an int8 copy of 1 byte per weight joins the packed blocks,
# which the store keeps in one buffer: about three times a 4-bit file's bytes in all
WITHOUT_KERNEL_PEAK = 3.0
WORKSPACE = 256 * 2**20  # a pass's activations and buffers beside the caches
GPU_WORKSPACE = 512 * 2**20  # on a GPU beside the weights: a pass's activations, the caches' first tokens


def check_fits(name: str, path: Path | None, size: int | None, precision: Precision, prepared: bool,
               held: int = 0, without_kernel: bool = False) -> None:
    """Raises ModelError when `name` needs more memory than this machine has in all. path: the GGUF
    file or model folder (None: unknown, e.g. a hub id: not checked); size: a packaged GGUF's size
    when its file is not assembled yet; prepared: a low-bit copy is already stored (no repacking);
    held: what the models already loaded beside it take (the pair's other model); without_kernel:
    its low-bit layers get an int8 copy for torch's matmul (lowbit/fallback)."""
    need, why = needed_bytes(path, size, precision, prepared, without_kernel)
    if need is None:
        return
    total = total_memory()
    if need + held + RESERVE > total:
        beside = f", beside the {held / 2**30:.1f} GiB the other model takes," if held else ","
        raise ModelError(
            f"{name} needs about {need / 2**30:.1f} GiB of memory {why}{beside} and this machine has "
            f"{total / 2**30:.1f} GiB in all (about {RESERVE / 2**30:.1f} GiB of it goes to the system and the "
            "app). Pick a smaller model" + (", or the low-bit precision for this one." if not precision.low_bit else ".")
        )


def check_float_load(name: str, weights: int | None, copy_bytes: int, element_bytes: int, device, cache: Path) -> None:
    """Raises ModelError, naming the sizes, when a float model cannot load onto a GPU (device): the
    disk its first start writes (copy_bytes: a GGUF's float32 copy, and the packaged file assembled
    beside it; 0 when written already), the host memory reading it takes (float32 while a GGUF is
    dequantized, else element_bytes per weight before it moves), or the GPU's memory free now."""
    if weights is None:
        return
    if copy_bytes:
        free = disk_free(cache)
        if copy_bytes > free:
            raise ModelError(
                f"Not enough disk space in {cache} to prepare {name} for the GPU: its float32 copy takes about "
                f"{copy_bytes / 2**30:.1f} GiB and {free / 2**30:.1f} GiB are free. Free some space, or set "
                "SPECCHAT_CACHE to a folder on another disk.")
    host, total = (4 if copy_bytes else element_bytes) * weights, total_memory()
    if host + RESERVE > total:
        raise ModelError(
            f"{name} needs about {host / 2**30:.1f} GiB of this machine's memory to read its {weights / 1e9:.1f} "
            f"billion weights {'as float32' if copy_bytes else 'before they move to the GPU'}, and it has "
            f"{total / 2**30:.1f} GiB in all. Pick a smaller model.")
    room = devices.free_memory(device)
    need = element_bytes * weights + GPU_WORKSPACE
    if room is not None and need > room[0]:
        free, total = room
        raise ModelError(
            f"{name} needs about {need / 2**30:.1f} GiB of GPU memory ({weights / 1e9:.1f} billion weights at "
            f"{element_bytes} bytes, and room to run), and {devices.device_name(device)} has {free / 2**30:.1f} GiB "
            f"free of {total / 2**30:.1f} GiB. Pick a smaller model, close what else uses the GPU, or run on the "
            "CPU at low bit (SPECCHAT_DEVICE=cpu).")


def disk_free(folder: Path) -> int:
    """Bytes free on the disk that holds `folder` (or its nearest existing parent)."""
    import shutil

    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def weight_count(path: Path | None) -> int | None:
    """Weights in a GGUF file or a model folder, from their headers; None when not told."""
    if path is None:
        return None
    if path.suffix.lower() == ".gguf" and path.is_file():
        return _gguf_weights(path)
    return _folder_weights(path) if path.is_dir() else None


def check_caches_fit(tokens: int, bytes_per_token: int, device=None) -> None:
    """Raises PromptTooLongError, as for a prompt longer than the context, when caches holding
    `tokens` tokens (at bytes_per_token for all the models together) do not fit the memory left:
    the machine's, or on a GPU (device) the GPU's."""
    room = devices.free_memory(device) if device is not None else None
    need, left = tokens * bytes_per_token + WORKSPACE, memory_left() if room is None else room[0]
    if need > left:
        raise PromptTooLongError(
            f"The prompt and the answer's room ({tokens:,} tokens) need about {need / 2**30:.1f} GiB of memory for "
            f"the models' caches, and {left / 2**30:.1f} GiB are free now; shorten the conversation, start a new "
            "chat, or lower the answer's length.")


def check_context_fits(tokens: int, bytes_per_token: int, device=None) -> None:
    """Raises ModelError when caches of a whole context of `tokens` tokens would not fit the memory
    left (the machine's, or a GPU's): the context length the user chose is refused at the load,
    not halfway through a long chat."""
    try:
        check_caches_fit(tokens, bytes_per_token, device)
    except PromptTooLongError:
        need = (tokens * bytes_per_token + WORKSPACE) / 2**30
        raise ModelError(f"A context of {tokens:,} tokens needs about {need:.1f} GiB of memory for the models' "
                         "caches, more than is free now: choose a shorter context length.") from None


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


def needed_bytes(path: Path | None, size: int | None, precision: Precision, prepared: bool,
                 without_kernel: bool = False) -> tuple[int | None, str]:
    """(bytes at the load's peak, what they are for), or (None, "") when they cannot be told."""
    gguf = size is not None or (path is not None and path.suffix.lower() == ".gguf" and path.is_file())
    if gguf and precision.low_bit:
        file_size = size if size is not None else path.stat().st_size
        if without_kernel:
            return int(file_size * WITHOUT_KERNEL_PEAK), "with the int8 copy torch's matmul runs (no kernel on this machine)"
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
            if without_kernel:
                return int(need + weights), "with the int8 copy torch's matmul runs (no kernel on this machine)"
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


def total_memory() -> int:
    import psutil

    return psutil.virtual_memory().total
