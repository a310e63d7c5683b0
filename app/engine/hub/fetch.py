"""Fetching a file from the hub into the standard hub cache (`models--user--name/blobs`,
`snapshots/<commit>/<file>`, `refs/<revision>`: where `hf_hub_download` and transformers find it),
resumable and checked.

`hf_hub_download` resumes only within one call (a dropped connection) and deletes its partial file
on any failure, so a cancelled or crashed download of a 5 GB GGUF would start again from nothing.
Here the partial file keeps a stable name beside its blob and huggingface_hub's own `http_get`
continues it with a ranged GET, after a cancel, a crash or a lost connection alike. The disk is
checked before the download starts and the finished file against the hub's SHA-256."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .access import HubError, cache_dir, endpoint, in_words, reachable

PARTIAL = ".partial"  # beside the blob it becomes
PIECE = 1 << 20  # bytes fetched between two progress reports (and cancel checks)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Cancelled(Exception):
    """The download was cancelled; what it fetched stays for the next pull to continue."""


@dataclass(frozen=True)
class Progress:
    done: int  # bytes on disk
    total: int | None
    seconds: float  # since this pull started
    fetched: int  # bytes fetched by this pull (not those a cancelled one left)

    @property
    def bytes_per_second(self) -> float:
        return self.fetched / self.seconds if self.seconds > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        if self.total is None or self.bytes_per_second <= 0:
            return None
        return (self.total - self.done) / self.bytes_per_second


Report = Callable[[Progress], None]


def repo_folder(repo_id: str) -> Path:
    return cache_dir() / f"models--{repo_id.replace('/', '--')}"


def pull(repo_id: str, filename: str, report: Report | None = None, cancel: threading.Event | None = None,
         revision: str = "main", expected_sha256: str | None = None) -> Path:
    """The file's path in the hub cache, fetched first where it is not there. Raises HubError (one
    line) when the hub cannot give it, or has another file than `expected_sha256` says, or the disk
    cannot hold it; Cancelled when `cancel` is set."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    what = f"fetching {repo_id}/{filename}"
    reachable()
    try:
        url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint())
        meta = get_hf_file_metadata(url, endpoint=endpoint())
    except Exception as error:  # huggingface_hub and its HTTP client raise many kinds
        raise in_words(error, what) from error
    if not meta.etag or not meta.commit_hash:
        raise HubError(f"The hub gave no version for {repo_id}/{filename}; cannot place it in the cache.")
    if expected_sha256 is not None and meta.etag != expected_sha256:
        raise HubError(f"The hub's {repo_id}/{filename} is not the file expected (another SHA-256).")
    folder = repo_folder(repo_id)
    blob = folder / "blobs" / meta.etag
    if not blob.is_file():
        partial = blob.with_name(blob.name + PARTIAL)
        _check_disk(partial, meta.size, filename)
        _fetch(meta.location, partial, meta.size, build_hf_headers(), report, cancel, what)
        _check_hash(partial, meta.etag, filename)
        os.replace(partial, blob)
    snapshot = folder / "snapshots" / meta.commit_hash / filename
    _link(snapshot, blob)
    if not re.fullmatch(r"[0-9a-f]{40}", revision):  # a branch or tag names the commit it was at
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / revision).write_text(meta.commit_hash)
    return snapshot


def pull_model(repo, names: list[str], report: Callable[[str, Progress], None] | None = None,
               cancel: threading.Event | None = None) -> Path:
    """Fetches `names` of the repository (catalog.files_to_pull); returns what then loads: the GGUF,
    or a folder model's snapshot folder."""
    paths = [pull(repo.id, name, (lambda progress, name=name: report(name, progress)) if report else None, cancel)
             for name in names]
    return paths[0] if repo.ggufs else paths[0].parent


def _check_disk(partial: Path, size: int | None, filename: str) -> None:
    from .. import memory_check  # (it imports torch: not for the window's start)

    have = partial.stat().st_size if partial.exists() else 0
    free = memory_check.disk_free(partial.parent)
    if size is not None and size - have > free:
        raise HubError(f"{filename} needs {(size - have) / 2**30:.2f} GiB more disk and {free / 2**30:.2f} GiB "
                       f"is free at {cache_dir()}; free some space (or remove a model) and pull again.")


def _fetch(url: str, partial: Path, size: int | None, headers: dict, report: Report | None,
           cancel: threading.Event | None, what: str) -> None:
    from huggingface_hub import constants
    from huggingface_hub.file_download import http_get

    # http_get writes (and reports) in pieces of this size: 10 MB by default, so a cancel or a
    # dropped connection lost up to 10 MB and the progress moved every 10 s on a slow line
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, PIECE)
    partial.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    if size is not None and have > size:  # not this version's bytes
        partial.unlink()
        have = 0
    watcher = _watcher(have, size, report, cancel)
    try:
        with partial.open("ab") as file:
            http_get(url, file, resume_size=have, headers=headers, expected_size=size, tqdm_class=watcher)
    except Cancelled:
        raise
    except OSError as error:
        if error.errno is not None:  # the disk, not the transfer
            raise HubError(f"Cannot write {partial.name} ({error.strerror}) while {what}; "
                           f"what was fetched stays and the next pull continues it.") from error
        raise in_words(error, what) from error
    except Exception as error:
        raise in_words(error, what) from error


def _watcher(have: int, size: int | None, report: Report | None, cancel: threading.Event | None):
    """A class huggingface_hub's http_get takes for its progress bar: it reports the progress and
    raises Cancelled from inside the transfer once `cancel` is set."""
    start = time.monotonic()

    class Watcher:
        def __init__(self, *args, **kwargs) -> None:
            self.done, self.fetched = have, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def update(self, n: int) -> None:
            self.done += n
            self.fetched += n
            if report is not None:
                report(Progress(self.done, size, time.monotonic() - start, self.fetched))
            if cancel is not None and cancel.is_set():
                raise Cancelled()

        def close(self) -> None:
            pass

    return Watcher


def _check_hash(partial: Path, etag: str, filename: str) -> None:
    """A large file's etag is its SHA-256 (a small one's is a git hash, checked by its size alone)."""
    if not _SHA256.match(etag):
        return
    digest = hashlib.sha256()
    with partial.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != etag:
        partial.unlink()
        raise HubError(f"{filename} arrived damaged (its SHA-256 is not the hub's) and was deleted; pull it again.")


def _link(snapshot: Path, blob: Path) -> None:
    """The snapshot's entry for the file: a relative link to the blob, as huggingface_hub makes it
    (a copy where the file system has no links)."""
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    if snapshot.is_file() and snapshot.resolve() == blob.resolve():
        return
    snapshot.unlink(missing_ok=True)
    try:
        snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    except OSError:
        shutil.copyfile(blob, snapshot)
