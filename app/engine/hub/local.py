"""The models already in the hub cache: what each repository holds there, and removing them."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from .access import HubError, cache_dir
from .fetch import PARTIAL, repo_folder


@dataclass(frozen=True)
class LocalModel:
    repo_id: str
    files: tuple[Path, ...]  # the runnable ones in its latest snapshot: its GGUFs, or the folder's config.json
    bytes: int  # all its blobs take, partial downloads included

    def sources(self) -> list[str]:
        """What SpecChat loads: each GGUF's path, or the snapshot folder of a folder model."""
        return [str(f.parent if f.name == "config.json" else f) for f in self.files]


def local_models() -> list[LocalModel]:
    """Every model repository in the hub cache, by name."""
    root = cache_dir()
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(root.glob("models--*")):
        repo_id = folder.name[len("models--"):].replace("--", "/", 1)
        snapshots = sorted((folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) if (folder / "snapshots").is_dir() else []
        files: list[Path] = []
        if snapshots:
            latest = snapshots[-1]
            files = sorted(p for p in latest.rglob("*.gguf") if "mmproj" not in p.name.lower() and p.is_file())
            if not files and (latest / "config.json").is_file():
                files = [latest / "config.json"]
        found.append(LocalModel(repo_id, tuple(files), _bytes(folder)))
    return found


def partial_bytes(repo_id: str) -> int:
    """What unfinished downloads of a repository hold (a cancel, a crash, a lost connection)."""
    blobs = repo_folder(repo_id) / "blobs"
    return sum(p.stat().st_size for p in blobs.glob(f"*{PARTIAL}")) if blobs.is_dir() else 0


def remove(repo_id: str) -> int:
    """Deletes a repository's files from the hub cache; the bytes freed."""
    folder = repo_folder(repo_id)
    if not folder.is_dir():
        raise HubError(f"{repo_id} is not in the hub cache ({cache_dir()}).")
    freed = _bytes(folder)
    try:
        shutil.rmtree(folder)
    except OSError as error:
        raise HubError(f"Cannot remove {repo_id} from {cache_dir()}: {error.strerror or error}.") from error
    return freed


def _bytes(folder: Path) -> int:
    """The bytes of the files under `folder`, links not followed (a snapshot entry points at a blob)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def is_here(repo_id: str, filename: str) -> bool:
    """Whether a snapshot of the repository in the hub cache holds the file whole."""
    snapshots = repo_folder(repo_id) / "snapshots"
    return snapshots.is_dir() and any((snapshot / filename).is_file() for snapshot in snapshots.iterdir())
