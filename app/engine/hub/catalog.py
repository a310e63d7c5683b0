"""What the hub offers that SpecChat can run: repositories found by keywords, `user/model` or a
URL, each with its files, their sizes and quantisations, and whether they fit this machine."""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

from ..choices import Precision
from .. import memory_check
from .access import api, cache_dir, in_words

SEARCH_LIMIT = 10  # repositories a search lists (each then asked for its files' sizes)
# GGUF quantisation names as files carry them (Q4_K_M, IQ4_XS, Q8_0, F16, BF16)
_QUANTIZATION = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|F16|BF16|F32)(?![A-Za-z0-9])", re.IGNORECASE)
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass(frozen=True)
class HubFile:
    name: str  # the path in the repository
    size: int | None  # bytes; None where the hub did not say
    sha256: str | None = None  # a large (LFS) file's hash, which the download is checked against

    @property
    def is_gguf(self) -> bool:
        # a vision projector (mmproj) is no language model of its own
        return self.name.lower().endswith(".gguf") and "mmproj" not in self.name.lower()

    @property
    def quantization(self) -> str | None:
        """The GGUF's quantisation as its name says it ("Q4_K_M"), or None."""
        match = _QUANTIZATION.search(self.name.rsplit("/", 1)[-1]) if self.is_gguf else None
        return match.group(1).upper() if match else None


@dataclass(frozen=True)
class HubRepo:
    id: str
    files: tuple[HubFile, ...]
    gated: bool = False
    downloads: int | None = None
    model_type: str | None = None  # the config's, where the hub tells it

    @property
    def ggufs(self) -> list[HubFile]:
        return [f for f in self.files if f.is_gguf]

    @property
    def is_folder_model(self) -> bool:
        """A transformers folder of an architecture the engine runs (the hub's config says which)."""
        from ..lowbit.skeleton import SUPPORTED  # (imports torch: only when asked)

        names = {f.name for f in self.files}
        return ("config.json" in names and any(n.endswith(WEIGHT_SUFFIXES) for n in names)
                and (self.model_type is None or self.model_type in SUPPORTED))

    @property
    def runnable(self) -> bool:
        return bool(self.ggufs) or self.is_folder_model

    @property
    def folder_bytes(self) -> int | None:
        """The bytes a folder model's download takes (its weights, config and tokenizer)."""
        sizes = [f.size for f in self.files if f.name.endswith((*WEIGHT_SUFFIXES, ".json", ".model", ".txt"))]
        return None if not sizes or None in sizes else sum(sizes)


def parse_query(text: str) -> tuple[str | None, str]:
    """(a repository id, None for keywords; the keywords). A hub URL or `user/model` names a
    repository; anything else is searched for."""
    text = text.strip()
    if text.startswith(("http://", "https://")):
        parts = [p for p in urlparse(text).path.split("/") if p]
        if len(parts) >= 2:
            return f"{parts[0]}/{parts[1]}", text
    if _REPO_ID.match(text):
        return text, text
    return None, text


def search(query: str, limit: int = SEARCH_LIMIT) -> list[HubRepo]:
    """The runnable repositories a query finds, each with its files and their sizes. Raises
    HubError with one line when the hub cannot answer."""
    repo_id, words = parse_query(query)
    if repo_id is not None:
        return [repository(repo_id)]
    what = f"searching the hub for '{words}'"
    try:
        found = list(api().list_models(search=words, limit=4 * limit, expand=["siblings", "config", "gated", "downloads"]))
    except Exception as error:  # huggingface_hub and its HTTP client raise many kinds
        raise in_words(error, what) from error
    candidates = [_repo(info) for info in found]
    return [repository(repo.id) for repo in candidates if repo.runnable][:limit]


def repository(repo_id: str) -> HubRepo:
    """One repository with every file's size and hash."""
    try:
        info = api().model_info(repo_id, files_metadata=True)
    except Exception as error:
        raise in_words(error, f"reading {repo_id} on the hub") from error
    return _repo(info)


def _repo(info) -> HubRepo:
    files = tuple(HubFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None) for s in (info.siblings or []))
    config = info.config if isinstance(info.config, dict) else {}
    return HubRepo(info.id, files, bool(info.gated), info.downloads, config.get("model_type"))


def fit(size: int | None, held: int = 0) -> str | None:
    """Why a download of `size` bytes, run at low bit, does not fit this machine's memory (beside
    `held` bytes of models loaded) or its disk; None when it fits or cannot be told."""
    if size is None:
        return None
    free = memory_check.disk_free(cache_dir())
    if size > free:
        return f"needs {size / 2**30:.1f} GiB of disk, {free / 2**30:.1f} GiB free"
    need, _ = memory_check.needed_bytes(None, size, Precision.LOWBIT, prepared=False)
    total = memory_check.total_memory()
    if need + held + memory_check.RESERVE > total:
        return f"needs about {need / 2**30:.1f} GiB of memory, this machine has {total / 2**30:.1f} GiB"
    return None
