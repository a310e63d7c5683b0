"""Where SpecChat keeps what it prepares once: repacked models and the compiled kernel."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """The user cache directory (`SPECCHAT_CACHE` overrides it)."""
    return Path(os.environ.get("SPECCHAT_CACHE") or platformdirs.user_cache_dir("specchat"))


@contextmanager
def written_whole(folder: Path) -> Iterator[Path]:
    """A folder to write what goes into `folder`: written beside it and renamed into place once
    complete, so a cut write never looks finished. When the writing fails (a full disk, say) the
    unfinished folder goes too: it would keep the disk full."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
