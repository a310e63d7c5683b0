"""Draft and verification costs remembered between starts.

Timing the models (engine.calibrate) takes one to two seconds of every start. The figures
belong to the models, their precision and the hardware (a GPU by its name; on the CPU the kernel
build, the thread count and the processor), so they are kept per such key in the user cache; steps refine them as before. A missing, unreadable or
unwritable file only means the models are timed again.
"""
from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from .files import cache_root
from .files import private_folder, write_text
from .engine import SpeculativeEngine
from .lowbit import kernel
from .policy import CostModel


def costs_path() -> Path:
    return cache_root() / "costs.json"


def calibrate_remembered(engine: SpeculativeEngine, path: Path | None = None) -> bool:
    """Sets engine.costs from the remembered figures, or times the models and remembers them.
    True when remembered figures were used."""
    path = path or costs_path()
    key = _key(engine)
    remembered = read_json(path)
    entry = remembered.get(key)
    if entry:
        try:
            engine.costs = CostModel(draft_token=float(entry["draft_token"]), catch_up_token=float(entry["catch_up_token"]),
                                     verify=_seconds(entry["verify"]),
                                     verify_at={int(b): _seconds(table) for b, table in entry.get("verify_at", {}).items()})
            if engine.costs.ready:
                return True
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # an older or damaged entry: time again
    engine.calibrate()
    costs = engine.costs
    remembered[key] = {"draft_token": costs.draft_token, "catch_up_token": costs.catch_up_token,
                       "verify": {str(n): s for n, s in costs.verify.items()},
                       "verify_at": {str(b): {str(n): s for n, s in table.items()} for b, table in costs.verify_at.items()}}
    write_json(path, remembered)
    return False


def _seconds(table: dict) -> dict[int, float]:
    return {int(n): float(s) for n, s in table.items()}


def _key(engine: SpeculativeEngine) -> str:
    draft = f"{engine.draft.name} ({engine.draft.label})" if engine.draft else "no draft"
    if engine.draft_vocabulary:
        draft += f", drafting {engine.draft_vocabulary.common} common tokens"
    return f"{engine.target.name} ({engine.target.label}) | {draft} | {hardware(engine.target.model.device)}"


def hardware(device: torch.device) -> str:
    """What the timings depend on besides the models: a GPU's name; on the CPU the low-bit
    kernel's build, the threads and the processor (a GPU machine never builds the CPU kernel)."""
    if device.type == "cuda":
        return f"{device} {torch.cuda.get_device_name(device)}"
    if device.type != "cpu":
        return str(device)
    return f"{device} | kernel {kernel.build_id()} | {torch.get_num_threads()} threads | {_cpu()}"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict) -> None:
    try:
        private_folder(path.parent)
        write_text(path, json.dumps(data, indent=1))
    except OSError:
        pass  # a full or read-only disk costs the next start its timing, nothing else
