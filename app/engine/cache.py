"""Where SpecChat keeps what it prepares once: repacked models and the compiled kernel."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """The user cache directory (`SPECCHAT_CACHE` overrides it)."""
    return Path(os.environ.get("SPECCHAT_CACHE") or platformdirs.user_cache_dir("specchat"))
