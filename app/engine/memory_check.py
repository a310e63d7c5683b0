"""A model that cannot fit this machine's memory is refused before it loads.

Loading one anyway ends with the process killed by the system (or the machine swapping for
minutes): a 32B GGUF on a 16 GB laptop, or a 7B at float32 (28 GB, the reference precision).
The estimate is the memory the load needs at its peak:
- a GGUF at low bit: its file's size (the kernel's layout is within 3% of the file's blocks),
  1.35 times that the first time, while its blocks are repacked (a 7B-shaped Q4_K_M: 5.76 GiB of
  the process's own memory for a 4.36 GiB file, 2026-12-06);
- float32 (and int8, which is quantized from it): 4 bytes per weight;
- a model folder at low bit: (bits + 1) / 8 bytes per weight (the integers, and a float16 scale and
  min per group of 32), and on its first start, read and quantized one tensor at a time, room for
  two float32 copies of its largest tensor (the default target's 1.78 billion weights as a bf16
  folder, 8 bits: 3.33 GiB of the process's own memory at the peak, 2026-12-06; the estimate says
  3.60 GiB).
Only a model that cannot fit even with nothing else running is refused: the memory other
programs hold now may be given back, and the system may swap some.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from .choices import Precision
from .errors import ModelError

RESERVE = 1.5 * 2**30  # the system, the app itself (Python, torch, Qt) and the other model's buffers
REPACK_PEAK = 1.35
QUANTIZING_COPIES = 2  # float32 copies of a folder's largest tensor while it is quantized


def check_fits(name: str, path: Path | None, size: int | None, precision: Precision, prepared: bool) -> None:
    """Raises ModelError when `name` needs more memory than this machine has in all. path: the GGUF
    file or model folder (None: unknown, e.g. a hub id: not checked); size: a packaged GGUF's size
    when its file is not assembled yet; prepared: a low-bit copy is already stored (no repacking)."""
    need, why = needed_bytes(path, size, precision, prepared)
    if need is None:
        return
    total = _total_memory()
    if need + RESERVE > total:
        raise ModelError(
            f"{name} needs about {need / 2**30:.1f} GiB of memory {why}, and this machine has "
            f"{total / 2**30:.1f} GiB in all (about {RESERVE / 2**30:.1f} GiB of it goes to the system and the "
            "app). Pick a smaller model" + (", or the low-bit precision for this one." if not precision.low_bit else ".")
        )


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
        counted = _folder_weights(path)
        if counted is not None and precision.low_bit:
            weights, largest = counted
            bits = max(b for b in precision.requantized_bits if b) if any(precision.requantized_bits) else 8
            need = int(weights * (bits + 1) / 8)
            if prepared:
                return need, f"at {bits} bits"
            return need + QUANTIZING_COPIES * 4 * largest, f"while its first start quantizes it to {bits} bits"
        weights = counted[0] if counted else None
    if weights is None:
        return None, ""
    return 4 * weights, f"to read its {weights / 1e9:.1f} billion weights as float32"


def _gguf_weights(path: Path) -> int | None:
    from .lowbit.gguf_file import parse

    try:
        return sum(int(tensor.n_elements) for tensor in parse(path).tensors)
    except Exception:  # a damaged file is reported by its load
        return None


def _folder_weights(folder: Path) -> tuple[int, int] | None:
    """Weights in a folder's safetensors files, and in its largest tensor, from their headers alone."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    sizes = []
    try:
        for file in files:
            with open(file, "rb") as handle:
                header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
            sizes += [math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__"]
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return sum(sizes), max(sizes, default=0)


def _total_memory() -> int:
    import psutil

    return psutil.virtual_memory().total
