"""Tokenizers read once per content.

A draft and its target come from one family and ship the same vocabulary; reading a 150k-token
tokenizer takes about a second on 2 cores, and comparing two of them for the pair check another
half. A folder whose tokenizer files equal an already loaded one's (chat templates aside: the
default pair's differ in one escape) gets a copy of that tokenizer sharing its backend, with the
folder's own chat template; the pair check accepts a shared backend at once.
"""
from __future__ import annotations

import copy
import hashlib
import json
import threading
import weakref
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

# What AutoTokenizer reads from a folder besides its chat templates (and config.json where
# tokenizer_config.json does not name the class: then the tokenizer is shared only within its folder).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model")
TEMPLATE_FILE = "chat_template.jinja"
OTHER_TEMPLATES = ("chat_template.json", "additional_chat_templates")  # kept in the key: rare, not worth parsing

_loaded: weakref.WeakValueDictionary[str, PreTrainedTokenizerBase] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def folder_tokenizer(folder: str | Path) -> PreTrainedTokenizerBase:
    """AutoTokenizer.from_pretrained(folder), its backend shared with every folder of the same files."""
    folder = Path(folder)
    key = _content_key(folder)
    with _lock:
        loaded = _loaded.get(key)
        if loaded is None:
            loaded = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
            _loaded[key] = loaded
            return loaded
    tokenizer = copy.copy(loaded)  # shallow: the same backend and special tokens
    template = folder / TEMPLATE_FILE
    tokenizer.chat_template = template.read_text(encoding="utf-8") if template.is_file() else \
        _config_template(folder)
    return tokenizer


def _content_key(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = folder / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    if not _config(folder).get("tokenizer_class") or any((folder / name).exists() for name in OTHER_TEMPLATES):
        digest.update(str(folder.resolve()).encode())
    return digest.hexdigest()


def _config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _config_template(folder: Path) -> str | None:
    return _config(folder).get("chat_template")
