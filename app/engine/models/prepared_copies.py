"""The prepared copies of models in the cache folder: what a model's first start writes (its
low-bit blocks repacked, or its float32 weights) so that later starts take seconds.

Each copy holds a note of where it came from, touched at every load (its time is the copy's last
use). A copy of a GGUF file or model folder that has since changed (another size or time: a new
download under the same name) is dropped when the new one's copy is made: nothing could load it
again, and a 7B model's copy is 4 to 8 GB. The rest can be listed and deleted (File > Prepared models on disk...); a
deleted copy is prepared again at the model's next start.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from . import defaults as default_models
from ..choices import Precision
from ..files import cache_root, is_partial, write_text

NOTE = "specchat_source.json"


@dataclass(frozen=True)
class PreparedCopy:
    path: Path  # a folder, or a file (a default model's GGUF assembled for the benchmark's peer)
    source: str | None  # a default model's name, a hub id, or a file's or folder's full path; None: not noted
    precision: str | None  # a low-bit precision's value, or "fp32" (the float32 copy fp32 and int8 load)
    size: int  # bytes
    last_used: float  # seconds since the epoch

    @property
    def source_missing(self) -> bool:
        """Whether the file or folder it was prepared from is gone (or on a drive not mounted now)."""
        return self.source is not None and Path(self.source).is_absolute() and not Path(self.source).exists()


def folder() -> Path:
    return cache_root() / "models"


def default_gguf(packaged: default_models.PackagedGGUF) -> Path:
    """Where a default model's GGUF is assembled or downloaded to."""
    return folder() / f"{packaged.name}.gguf"


def noted_source(source: str) -> str:
    """What a copy notes as its source: a default model's name, a hub id, or the file's or folder's
    full path."""
    path = Path(source).expanduser()
    if source in default_models.DEFAULTS or not (path.exists() or path.is_absolute() or source.startswith((".", "~"))):
        return source
    return str(path.resolve())


def float_model(source: str) -> bool:
    """Whether a source is a float model (a folder or hub id), whose low bit is 8 bits, not a
    GGUF's own blocks."""
    return source not in default_models.DEFAULTS and not source.lower().endswith(".gguf")


def noted_precision(precision: Precision | str) -> str:
    """What a copy notes as its precision: fp32 and int8 load the same float32 copy."""
    precision = Precision(precision)
    return precision.value if precision.low_bit else Precision.FP32.value


def note_use(copy: Path, source: str, precision: str) -> None:
    """Notes where `copy` came from and that it was used now; drops any other copy of the same source
    and precision, made from an earlier version of it (a copy's name holds its source's sizes and
    times, or a hub id's revision). A note that cannot be written (a read-only cache) changes nothing."""
    try:
        write_text(copy / NOTE, json.dumps({"source": source, "precision": precision}))
    except OSError:
        return
    for other in copies():
        if other.path != copy and (other.source, other.precision) == (source, precision):
            try:
                delete(other)
            except OSError:  # left for the user to delete (File > Prepared models on disk...)
                pass


def copies() -> list[PreparedCopy]:
    """Every copy in the cache folder, the most recently used first (unfinished ones left out)."""
    found = []
    root = folder()
    for path in root.iterdir() if root.is_dir() else []:
        if is_partial(path):
            continue
        try:
            note = json.loads((path / NOTE).read_text()) if path.is_dir() else {}
        except (OSError, ValueError):
            note = None
        if not isinstance(note, dict):  # none, or damaged
            note = _guessed_note(path)
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        try:
            stats = [p.stat() for p in files]
            noted = path / NOTE
            used = noted.stat().st_mtime if noted.is_file() else max((s.st_mtime for s in stats), default=0.0)
        except OSError:  # deleted meanwhile
            continue
        found.append(PreparedCopy(path, note.get("source"), note.get("precision"), sum(s.st_size for s in stats), used))
    return sorted(found, key=lambda c: c.last_used, reverse=True)


def _guessed_note(path: Path) -> dict:
    """A copy made before copies noted their source: a default model's is known by its folder's
    name ("<name>-<precision>", or "<name>" for float32), another's precision by the name's end."""
    for key, packaged in default_models.DEFAULTS.items():
        if path.name == packaged.name:
            return {"source": key, "precision": Precision.FP32.value}
        for precision in Precision:
            if path.name == f"{packaged.name}-{precision.value}":
                return {"source": key, "precision": precision.value}
    return {"precision": next((p.value for p in Precision if p.low_bit and path.name.endswith(f"-{p.value}")), None)}


def delete(copy: PreparedCopy) -> None:
    """Deletes a copy (raises OSError when it cannot)."""
    if copy.path.is_dir():
        shutil.rmtree(copy.path)
    else:
        copy.path.unlink()


def age_in_words(seconds_since_epoch: float, now: float | None = None) -> str:
    """'today', 'yesterday', '5 days ago' or the date (local calendar days), for a copy's last use."""
    then = date.fromtimestamp(seconds_since_epoch)
    days = (date.fromtimestamp(time.time() if now is None else now) - then).days
    if days <= 0:
        return "today"
    if days == 1:
        return "yesterday"
    return f"{days} days ago" if days < 30 else then.isoformat()
