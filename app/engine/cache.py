"""Where SpecChat keeps what it prepares once: repacked models, the compiled kernel, saved caches."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from .files import private_folder


def cache_root() -> Path:
    """The user cache directory (`SPECCHAT_CACHE` overrides it), owner-only; one that cannot be
    made so (a read-only disk) is returned as it is: what writes there says why it cannot."""
    root = Path(os.environ.get("SPECCHAT_CACHE") or platformdirs.user_cache_dir("specchat"))
    try:
        return private_folder(root)
    except OSError:
        return root
