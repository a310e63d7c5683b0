"""The device the models run on: which one and in what dtype, the memory it has free, and waiting
for the work queued on it.

A CUDA GPU runs bfloat16 where it can (Ampere and later), float16 on older cards; an Apple GPU
(MPS) runs float16, with torch's CPU fallback for the few operations it lacks (switched on in
app/__init__.py, before torch is imported); otherwise the CPU runs the low-bit models.
SPECCHAT_DEVICE=cpu (or cuda, mps) overrides the choice: the low-bit CPU path can beat a small GPU
on a small model.
"""
from __future__ import annotations

import os

import torch


AUTO = "auto"  # the window's device choice that lets pick_device decide


def gpus() -> list[tuple[str, str]]:
    """(device, name) of each GPU torch sees: "cuda:N" for each CUDA card, "mps" for an Apple GPU."""
    found = [(f"cuda:{index}", torch.cuda.get_device_name(index)) for index in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return found + ([("mps", "Apple GPU")] if torch.backends.mps.is_available() else [])


def pick_device(chosen: str = AUTO) -> tuple[torch.device, torch.dtype, str]:
    """The device, its dtype, and why, in words for the UI. chosen: the window's choice, "auto"
    (a GPU where torch sees one), "cpu", "cuda:N" or "mps"; SPECCHAT_DEVICE overrides it, and says so."""
    forced = os.environ.get("SPECCHAT_DEVICE", "").strip().lower()
    wanted = forced or ("" if chosen == AUTO else chosen)
    by = "in the window"
    if forced:
        by = "SPECCHAT_DEVICE" + (f", over the window's {chosen}" if chosen not in (AUTO, forced) else "")
    if wanted == "cpu":
        return torch.device("cpu"), torch.float32, f"CPU: chosen by {by}" if forced else "CPU: chosen in the window"
    index = int(wanted.partition(":")[2] or 0) if wanted.startswith("cuda") else 0
    if (wanted == "" or wanted.startswith("cuda")) and torch.cuda.is_available() and (
            ":" not in wanted or index < torch.cuda.device_count()):
        device = torch.device("cuda", index) if ":" in wanted else torch.device("cuda")
        name = torch.cuda.get_device_name(index)
        if torch.cuda.is_bf16_supported():
            return device, torch.bfloat16, f"CUDA: {name} (bfloat16)"
        # cards before Ampere have no bfloat16 arithmetic: float16 keeps them on the GPU
        return device, torch.float16, f"CUDA: {name} (float16: this card has no bfloat16)"
    if wanted in ("", "mps") and torch.backends.mps.is_available():
        return torch.device("mps"), torch.float16, "Apple GPU (MPS, float16)"
    if wanted:
        asks = "SPECCHAT_DEVICE asks" if forced else "the window asks"
        return torch.device("cpu"), torch.float32, f"CPU: {asks} for {wanted}, which torch does not see"
    return torch.device("cpu"), torch.float32, "CPU: no CUDA or Apple GPU visible to torch"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "the Apple GPU" if device.type == "mps" else "the CPU"


def free_memory(device: torch.device) -> tuple[int, int] | None:
    """(bytes free now, bytes in all) of a GPU's memory; None on the CPU (memory_check reads the system's).
    Free counts the blocks torch's allocator holds for this process without using them."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), total
    if device.type == "mps":  # what Metal recommends this process keep under, less what it holds
        total = torch.mps.recommended_max_memory()
        return max(0, total - torch.mps.driver_allocated_memory()), total
    return None


def synchronize(device: torch.device) -> None:
    """Waits for the work queued on a GPU (a timing that does not wait measures only the queueing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def release_cached(device: torch.device) -> None:
    """Gives the memory of freed tensors back to the GPU, for the next model to load into (torch's
    allocator otherwise keeps it for this process's own next tensors)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
