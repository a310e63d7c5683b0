"""Files and folders written so that a kill or a power cut never leaves one half-written, and
that other users of the machine cannot read: folders owner-only (0700), files 0600, each file
written under a name of its own process, flushed to the disk, then renamed into place.

A saved cache or a prepared copy is no safer to share than the chats: a conversation's keys and
values invert back to its text with the model's public weights."""
from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs

PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600
_PARTIAL = re.compile(r"\.partial(?:-(\d+))?$")  # "<name>.partial-<pid>"; plain ".partial" from older versions


def private_folder(path: Path) -> Path:
    """`path` (and its missing parents) as a folder only its owner may enter; an existing one of
    ours is narrowed to that."""
    for missing in reversed([folder for folder in (path, *path.parents) if not folder.exists()]):
        missing.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)  # its parents too: mkdir gives them the umask's
    info = path.stat()
    # (Windows has no POSIX modes to narrow: a user's profile folders are private there already)
    if hasattr(os, "getuid") and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(PRIVATE_FOLDER)
    return path


def partial_name(path: Path) -> Path:
    """The name `path` is written under until it is whole: one per process, so that two processes
    never write, or delete, each other's unfinished file."""
    return path.with_name(f"{path.name}.partial-{os.getpid()}")


def sync_folder(folder: Path) -> None:
    """Makes a rename or a new name in `folder` survive a power cut (no-op where folders cannot
    be opened, as on Windows)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """A file name to write what goes into `path`: on success it is flushed to the disk, made
    owner-only and renamed over `path`; on failure it goes, and `path` is as it was."""
    partial = partial_name(path)
    try:
        yield partial
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        partial.chmod(PRIVATE_FILE)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def write_text(path: Path, text: str) -> None:
    with replaced(path) as partial:
        partial.write_text(text, encoding="utf-8")


@contextmanager
def written_whole(folder: Path) -> Iterator[Path]:
    """A folder to write what goes into `folder`: written beside it under this process's name,
    flushed to the disk and renamed into place once complete, so a cut write never looks finished.
    When the writing fails (a full disk, say) the unfinished folder goes too: it would keep the disk
    full."""
    private_folder(folder.parent)
    partial = partial_name(folder)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(mode=PRIVATE_FOLDER)
    try:
        yield partial
        for file in partial.rglob("*"):
            if file.is_file():
                file.chmod(PRIVATE_FILE)
                with open(file, "rb") as written:
                    os.fsync(written.fileno())
        for sub in [partial, *(p for p in partial.rglob("*") if p.is_dir())]:
            sync_folder(sub)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    sync_folder(folder.parent)


def is_partial(path: Path) -> bool:
    return _PARTIAL.search(path.name) is not None


def remove_abandoned(folder: Path) -> list[Path]:
    """Deletes the unfinished files and folders in `folder` whose writing process has gone (a kill,
    a crash, a power cut): a first start's half-written copy takes gigabytes. Returns them."""
    removed = []
    for path in folder.iterdir() if folder.is_dir() else []:
        match = _PARTIAL.search(path.name)
        if match is None or (match.group(1) and _process_alive(int(match.group(1)))):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    import psutil

    return psutil.pid_exists(pid)


def private_temporary_folder(parent: Path, prefix: str) -> Path:
    """A new owner-only folder under `parent` whose name no one can take first."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=private_folder(parent)))


def cache_root() -> Path:
    """Where SpecChat keeps what it prepares once (repacked models, the compiled kernel, saved
    caches): the user cache directory (`SPECCHAT_CACHE` overrides it), owner-only; one that cannot
    be made so (a read-only disk) is returned as it is: what writes there says why it cannot."""
    root = Path(os.environ.get("SPECCHAT_CACHE") or platformdirs.user_cache_dir("specchat"))
    try:
        return private_folder(root)
    except OSError:
        return root
