"""What the hub offers that SpecChat can run: repositories found by keywords, `user/model` or a
URL, each with its files, their sizes and quantisations, and whether they fit this machine."""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

from ..choices import Precision
from .. import memory_check
from .access import HubError, api, cache_dir, in_words

SEARCH_LIMIT = 10  # repositories a search lists (each then asked for its files' sizes)
# A repository's GGUF taken when none is named and it has several: the common choice of size and quality
PREFERRED_QUANTIZATIONS = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q4_0", "Q8_0")
FOLDER_FILES = (".json", ".safetensors", ".model", ".txt", ".tiktoken")  # what a transformers folder needs
# "Qwen2.5-Coder-1.5B-Instruct" -> "Qwen2.5-Coder": the name up to its size
_SIZE_IN_NAME = re.compile(r"[-_.]\d+(?:\.\d+)?[BM](?![A-Za-z])", re.IGNORECASE)
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


def files_to_pull(repo: HubRepo, chosen: str | None = None) -> list[str]:
    """The files a download of `repo` fetches: the chosen GGUF, the only one, or the preferred
    quantisation; a transformers folder's config, tokenizer and weights."""
    if chosen:
        return [chosen]
    if repo.ggufs:
        if len(repo.ggufs) == 1:
            return [repo.ggufs[0].name]
        by_quantization = {f.quantization: f.name for f in repo.ggufs}
        preferred = next((by_quantization[q] for q in PREFERRED_QUANTIZATIONS if q in by_quantization), None)
        if preferred:
            return [preferred]
        raise HubError(f"{repo.id} has several GGUF files; name one: {', '.join(f.name for f in repo.ggufs)}")
    if repo.is_folder_model:
        return [f.name for f in repo.files if f.name.endswith(FOLDER_FILES) and "/" not in f.name]
    raise HubError(f"{repo.id} holds nothing SpecChat can run (no GGUF file, no model folder of a supported architecture).")


def family_of(name: str) -> str:
    """A model's family as its name says it, the name up to its size: "Qwen2.5-Coder"."""
    base = name.rsplit("/", 1)[-1].removesuffix(".gguf")
    return _SIZE_IN_NAME.split(base, maxsplit=1)[0] or base


def smaller_of_family(name: str, below_bytes: int, limit: int = 5) -> list[tuple[HubRepo, HubFile]]:
    """Repositories on the hub of the same family as the model `name`, each with its preferred GGUF
    when that is smaller than below_bytes (drafts to fetch). Raises HubError as search does."""
    found = []
    for repo in search(family_of(name), limit=2 * limit):  # (the hub's search: ids that contain the words)
        if family_of(repo.id).lower() != family_of(name).lower() or not repo.ggufs:
            continue
        try:
            chosen = files_to_pull(repo)[0]
        except HubError:  # several files, none preferred: its smallest
            chosen = min(repo.ggufs, key=lambda f: f.size or 0).name
        file = next(f for f in repo.ggufs if f.name == chosen)
        if file.size is not None and file.size < below_bytes:
            found.append((repo, file))
    return found[:limit]
