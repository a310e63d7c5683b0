"""Where SpecChat keeps what it prepares once: repacked models, the compiled kernel, saved caches."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from .files import private_folder


def cache_root() -> Path:
    """The user cache directory (`SPECCHAT_CACHE` overrides it), owner-only."""
    return private_folder(Path(os.environ.get("SPECCHAT_CACHE") or platformdirs.user_cache_dir("specchat")))
