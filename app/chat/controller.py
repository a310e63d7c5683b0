"""One conversation's life, without Qt: the models (a pool that loads one choice at a time), the
engine they make, the current chat, and the one generation or read-ahead that runs on it.

The window calls its methods and subscribes to its events; it holds no engine and no algorithm.
The engine's blocking work runs on threads of its own (engine.api.in_thread, steps_of), awaited
by coroutines on the running asyncio loop: the window's is qasync's, which is Qt's own loop, so
every event below is emitted on the window's thread.
"""
from __future__ import annotations

import asyncio
import threading
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.api import (GenerationOptions, LoadOptions, ModelError, ModelPool, PromptTooLongError, Turns, call_soon,
                          in_thread, noted_precision, noted_source, steps_of, vocabulary_mismatch)
from .events import Event
from .prompt import chat_prompt_ids, switches_thinking
from .session import ChatSession, Overflow, Request
from .store import ChatStore, StoreError

if TYPE_CHECKING:
    from ..engine.api import SpeculativeEngine


@dataclass(frozen=True)
class ModelsReady:
    """What the window says once a pair is loaded."""

    chosen: LoadOptions
    target: str  # name (precision)
    draft: str | None  # name (precision); None: no draft model (prompt lookup)
    draft_refused: str | None  # why the chosen draft cannot draft for this target
    device: str  # in words
    thinking_switchable: bool  # the target's chat template can switch thinking off
    new_target: bool  # another target than the pair loaded before (or the first)
    served: Served | None = None  # a target on a server (None: it runs here)
    on_gpu: bool = False  # the pair runs on a GPU: the precision pickers (the CPU's) do not apply
    max_context: int = 0  # the longest context the target was made for (0: unknown)
    gpus: tuple[tuple[str, str], ...] = ()  # (device, name) of each GPU torch sees


@dataclass(frozen=True)
class Served:
    """What a window shows of a server it connected to."""

    model: str  # the one in use
    models: tuple[str, ...]  # all it serves
    colours_note: str  # where its colours come from


class ChatController:
    def __init__(self, store: ChatStore, load=None, saved_caches: Path | None = None) -> None:
        """load: models.load_model's signature (its default); saved_caches: where the models'
        caches are kept between runs (none: not kept)."""
        self.store = store
        self.models = ModelPool(load, saved_caches, load_marker=store.path.parent / "loading.json")
        self.session = ChatSession(store)
        self.engine: SpeculativeEngine | None = None
        self.turns = Turns()  # shared with a local server's requests: one job on the engine at a time
        self.loading = False  # models are being loaded for the latest choice
        self.loaded_options: LoadOptions | None = None  # the choice that last loaded: a failed one goes back to it
        self._cancel = threading.Event()  # the running answer's
        self._stop_waiting = asyncio.Event()  # set by Stop: an answer waiting for its turn gives it up
        self.closing: threading.Thread | None = None  # saving the caches as the window closes
        self._forgetting = threading.Lock()  # one forgetting job at a time
        self._pending = threading.Lock()  # the list below, shared with those jobs' threads
        self._generation: asyncio.Task | None = None
        self._reading_ahead: tuple[asyncio.Task, threading.Event] | None = None
        self._closed = False
        # chats deleted while no engine could forget them (prompt messages, thinking): forgotten once one can
        self._forget_when_loaded: list[tuple[list[dict], bool]] = []

        self.load_progress = Event()  # (stage: str, fraction: float | None)
        self.models_ready = Event()  # (ModelsReady)
        self.load_failed = Event()  # (message: str, retrying: LoadOptions | None, the choice loaded instead)
        self.source_refused = Event()  # (source, reason, unreadable: bool): a model added to the pickers
        self.started = Event()  # (RequestKind)
        self.step = Event()  # (Step), after the answer took it in
        self.finished = Event()  # (changed: Message | None, kind: RequestKind)
        self.error = Event()  # (title, message)
        self.notice = Event()  # (message): something the user should know, not an error

    # ---- models ---------------------------------------------------------------------------------
    def load(self, chosen: LoadOptions) -> None:
        """Loads `chosen` (keeping the models it shares with the pair in use); any load still
        running becomes stale. The models' caches are saved first, for the next time they run."""
        ticket = self.models.request()
        self._stop_reading_ahead()
        leaving = self.engine if not self.session.busy else None
        self.engine, self.loading = None, True
        self.spawn(self._load(ticket, chosen, leaving))

    async def _load(self, ticket: int, chosen: LoadOptions, leaving: SpeculativeEngine | None) -> None:
        loop = asyncio.get_running_loop()

        def report(stage: str, fraction: float | None) -> None:
            call_soon(loop, lambda: self.models.is_current(ticket) and self.load_progress.emit(stage, fraction))

        def job() -> SpeculativeEngine | None:
            nonlocal leaving
            if leaving is not None:
                leaving.save_caches()  # waits for the read-ahead told to stop
                leaving = None  # no longer held here: a replaced model's memory goes before the next loads
            return self.models.engine(ticket, chosen, report)

        error = None
        try:  # after the answers already running or queued (the server's), before those that come next
            engine = await self.turns.hold(lambda: in_thread("load", job))
        except ModelError as failure:  # a missing or corrupt model file
            engine, error = None, str(failure)
        except Exception as failure:  # anything else: said in the window, traceback in the log
            traceback.print_exc()
            engine, error = None, f"{type(failure).__name__}: {failure}"
        if self._closed or not self.models.is_current(ticket):
            return  # another choice came meanwhile: its load reports instead
        self.loading = False
        if engine is None:
            # Back to the pair that last loaded (its prepared copies load in seconds), or at the start
            # to the default pair (a saved choice whose file is gone), rather than leaving none.
            fallback = self.loaded_options or LoadOptions()
            retrying = fallback if chosen != fallback else None
            if retrying is not None:
                self.load(retrying)
            self.load_failed.emit(error or "unknown error", retrying)
            return
        previous, self.loaded_options, self.engine = self.loaded_options, chosen, engine
        self._forget_deleted_chats()
        target, draft = engine.target, engine.draft
        self.models_ready.emit(ModelsReady(
            chosen, f"{target.name} ({target.label})", f"{draft.name} ({draft.label})" if draft else None,
            engine.draft_refused, self.models.device_text or "", switches_thinking(target.tokenizer),
            previous is None or previous.target != chosen.target,
            Served(target.name, engine.served_models, engine.speculation.note) if self.served_by else None,
            self.models.on_gpu, getattr(target, "max_context", target.context_length), tuple(self.models.gpus)))

    def crashed_load(self) -> tuple[str, LoadOptions | None] | None:
        """(what to tell, the choice to load instead or None to load the same) when the last run
        ended while it loaded models: loading other than the default pair again could end this
        one the same way."""
        crashed = self.models.crashed_load
        if crashed is None:
            return None
        defaults = LoadOptions()
        if (crashed["target"], crashed["draft"]) == (defaults.target, defaults.draft):
            pair, then, instead = "the default pair", "It is loaded again now.", None
        else:
            pair, then, instead = f"{crashed['target']} with draft {crashed['draft']}", \
                "This run starts with the default pair; pick those models again to retry.", defaults
        return (f"The last run ended while it loaded {pair} (a crash, or the system ending it for want of "
                f"memory). {then}", instead)

    def check_source(self, source: str) -> None:
        """Reads a model's tokenizer off the UI thread: source_refused when it cannot be read, or
        cannot draft for the loaded target."""
        if self.engine is None:
            return
        target = self.engine.target

        def check() -> tuple[str, bool] | None:
            try:
                tokenizer = self.models.tokenizer(source)
            except ModelError as error:
                return str(error), True
            mismatch = vocabulary_mismatch(tokenizer, target.tokenizer, source, target.name)
            return (mismatch, False) if mismatch else None

        async def run() -> None:
            refused = await in_thread("check-model", check)
            if refused is not None:
                self.source_refused.emit(source, *refused)

        self.spawn(run())

    def models_in_use(self, choosing: LoadOptions) -> frozenset[tuple[str, str]]:
        """The (source, precision) of the prepared copies the pair loaded and the one chosen now
        read: not to be deleted."""
        drafting = self.engine is None or self.engine.draft is not None  # not a draft of another vocabulary
        used = []
        for options in {self.loaded_options, choosing} - {None}:
            used.append((options.target, options.precision))
            if drafting:
                used.append((options.draft, options.draft_precision))
        return frozenset((noted_source(source), noted_precision(precision)) for source, precision in used)

    @property
    def served_by(self) -> str | None:
        """The server's address when the target runs there (None: here, or nothing loaded)."""
        return self.engine.served_by if self.engine is not None else None

    def memory(self) -> tuple[str, str] | None:
        """(the models' weights and what their caches take now, the line's explanation)."""
        if self.engine is None:
            return None
        if self.served_by:
            return (f"no model here: the target is {self.engine.target.label}",
                    "Only the tokenizer is loaded here; the server holds the models and their caches.")
        target, draft, caches = self.engine.target, self.engine.draft, self.engine.cache_bytes()
        kv = str(self.engine.kv_cache).removeprefix("torch.") if self.engine.kv_cache else None
        return (f"target {target.memory_bytes / 2**30:.2f} GiB ({target.label}), "
                + (f"draft {draft.memory_bytes / 2**30:.2f} GiB ({draft.label})" if draft else "no draft model")
                + (f", caches {caches / 2**20:,.0f} MiB" if caches else "") + (f" ({kv})" if caches and kv else ""),
                (f"The draft's weights add {draft.memory_bytes / target.memory_bytes:.0%} to the target's. " if draft
                 else "") + "The caches hold the keys and values of this conversation, and of earlier ones kept so "
                "that going back to them reads only what is new.")

    # ---- chats ----------------------------------------------------------------------------------
    @property
    def conversation(self):
        return self.session.conversation

    def new_chat(self, system_prompt: str = "") -> bool:
        if self.session.busy:
            return False
        self.session.new_chat(system_prompt)
        return True

    def open_chat(self, chat_id: int) -> bool:
        """Raises StoreError (a damaged file) or KeyError (deleted meanwhile)."""
        if self.session.busy:
            return False
        self.session.open_chat(chat_id)
        return True

    def import_chat(self, conversation) -> bool:
        """A chat read from a file (export.from_json) saved as a new chat and opened; False while an
        answer runs or when it cannot be saved (said by `error`)."""
        if self.session.busy:
            return False

        conversation.id = None
        if not self._save(lambda: self.store.save_chat(conversation)):
            return False
        self.session.open_chat(conversation.id)
        return True

    def fork(self, index: int, shown: int | None = None) -> bool:
        """A new chat with this one's messages up to messages[index] (shown: the version that
        message shows there), saved with a link to this one and opened; False while an answer runs
        or when it cannot be saved (said by `error`)."""
        if self.session.busy or self.conversation.id is None or not 0 <= index < len(self.conversation.messages):
            return False
        forked = self.conversation.fork(index, shown)
        if not self._save(lambda: self.store.save_chat(forked)):
            return False
        self.session.open_chat(forked.id)
        return True

    def rename_chat(self, title: str) -> None:
        if self.conversation.id is not None and title.strip():
            self.conversation.title = title.strip()
            self._save(lambda: self.store.rename_chat(self.conversation.id, self.conversation.title))

    def delete_chat(self, system_prompt: str = "") -> None:
        """Deletes the open chat, and every copy the models keep of it (in memory and on disk);
        a new chat follows."""
        if self.conversation.id is None or self.session.busy:
            return
        with self._pending:
            self._forget_when_loaded.append((self.session.prompt_for(""), self.session.thinking))
        self._forget_deleted_chats()
        self._save(lambda: self.store.delete_chat(self.conversation.id))
        self.new_chat(system_prompt)

    def set_system_prompt(self, text: str) -> None:
        self.session.set_system_prompt(text)
        self._report_save_errors()

    def set_preset(self, name: str, system_prompt: str) -> None:
        """The open chat's preset (its name) and the system prompt it brings."""
        self.session.set_preset(name, system_prompt)
        self._report_save_errors()

    def show_version(self, index: int, version: int) -> bool:
        """Shows another version of the answer at messages[index]; True when that made a fork.
        The last answer flips in place; an earlier one forks, showing that version there, so
        that the turns after it keep the context they were answered in."""
        message = self.conversation.messages[index]
        if index < len(self.conversation.messages) - 1 and version != message.shown:
            return self.fork(index, version)
        self.session.show_version(index, version)
        self._report_save_errors()
        return False

    def _forget_deleted_chats(self) -> None:
        """Forgets the deleted chats' caches on a thread, in a turn at the engine of its own."""
        if self.engine is None or not self._forget_when_loaded:
            return
        self._stop_reading_ahead()
        engine = self.engine
        self.spawn(self.turns.hold(lambda: in_thread("forget", lambda: self._forget_now(engine))))

    def _forget_now(self, engine: SpeculativeEngine) -> None:
        """(On a thread.) Forgets the deleted chats' caches; one still in use by a request
        (forget_conversation timed out) stays on the list, to be tried again after it. One job at
        a time: the one at close waits for one still running, and finds what none took yet."""
        tokenizer = engine.target.tokenizer
        with self._forgetting:
            with self._pending:
                pending, self._forget_when_loaded = self._forget_when_loaded, []
            left = [(prompt, thinking) for prompt, thinking in pending if not engine.forget_conversation(
                chat_prompt_ids(tokenizer, prompt, thinking), wait_seconds=10)]
            with self._pending:
                self._forget_when_loaded[:0] = left

    # ---- generation -----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.engine is not None and not self.session.busy

    def ask(self, text: str, options: GenerationOptions, replacing: int | None = None) -> bool:
        """Sends `text` (in place of the user message at `replacing`, whose later messages go)."""
        if not self.ready:
            return False
        if replacing is not None:
            self._start(self.session.edit(replacing, text, self.engine, options))
        else:
            self._start(self.session.ask(text, self.engine, options))
        return True

    def answer_pending(self, options: GenerationOptions) -> bool:
        return self.ready and self._start(self.session.answer(self.engine, options))

    def regenerate(self, options: GenerationOptions) -> bool:
        return self.ready and self._start(self.session.regenerate(self.engine, options))

    def continue_answer(self, options: GenerationOptions) -> bool:
        return self.ready and self._start(self.session.continue_answer(self.engine, options))

    def compare(self, options: GenerationOptions) -> bool:
        """(Not for a target on a server: its speculation is the server's, on for every request.)"""
        return self.ready and not self.served_by and self._start(self.session.compare(self.engine, options))

    def stop(self) -> bool:
        """Stops the answer at its next step, or before it starts while it waits for its turn;
        False when none runs."""
        running = self.session.busy
        self._cancel.set()
        self._stop_waiting.set()
        return running

    def _start(self, request: Request | None) -> bool:
        self._report_save_errors()
        if request is None:
            return False
        self._cancel = cancel = threading.Event()
        self._stop_waiting = asyncio.Event()
        self.started.emit(request.kind)
        if request.left_out:
            context = self.engine.target.context_length
            self.notice.emit(f"The chat is longer than its context of {context:,} tokens: its {request.left_out} "
                             f"oldest {'messages were' if request.left_out > 1 else 'message was'} left out of this answer's prompt.")
        self._generation = self.spawn(self._generate(self.engine, request, cancel))
        return True

    async def _generate(self, engine: SpeculativeEngine, request: Request, cancel: threading.Event) -> None:
        self.turns.reserve(always=True)
        released = True  # (no turn is held yet)
        try:
            if not await self.turns.take_unless(self._stop_waiting):  # after the server's requests that came first
                return  # stopped while it waited
            released = False
            await self.make_room()
            steps = steps_of("generate", lambda: engine.generate(request.prompt_ids, request.options, cancel), cancel,
                             on_end=self.turns.release)
            released = True  # by steps_of, once the engine's thread ends
            async for step in steps:
                if self._closed:
                    return
                self.session.add_step(step)
                self.step.emit(step)
        except PromptTooLongError as error:  # a refusal, said in the dialog: no traceback
            self.error.emit("Generation failed", str(error))
        except Exception as error:  # shown in a dialog; the traceback goes to the log
            traceback.print_exc()
            self.error.emit("Generation failed", str(error))
        finally:
            if not released:
                self.turns.release()
            if not self._closed:
                changed = self.session.finish()
                self._report_save_errors()
                self._forget_deleted_chats()  # one the answer's request held
                self.finished.emit(changed, request.kind)

    def context_room(self, text: str, adding: str) -> tuple[int, int, int] | None:
        """For a message `text` that `adding` (a document) would join: (the tokens `adding` takes,
        the tokens left for it in the context beside the chat and `text`, the context's length);
        None before the models load. A chat that drops its oldest turns counts only its system
        prompt: the earlier turns give way."""
        if self.engine is None:
            return None
        tokenizer, context = self.engine.target.tokenizer, self.engine.target.context_length
        history = self.session.overflow is not Overflow.DROP_OLDEST
        used = len(self.session.prompt_ids_for(text, self.engine, history=history))
        return len(tokenizer(adding, add_special_tokens=False)["input_ids"]), context - used, context

    def prompt_tokens(self) -> int:
        """The running request's prompt length (0: none runs)."""
        return self.session.builder.stats.prompt_tokens if self.session.builder else 0

    # ---- reading ahead --------------------------------------------------------------------------
    def read_ahead(self, text: str, replacing: int | None = None) -> None:
        """Lets the models read the message typed so far into their caches, as sending it would give
        it to them (SpeculativeEngine.read_ahead), after stopping the read-ahead before it."""
        if not text or not self.ready or self.turns.busy:
            return
        engine = self.engine
        prompt_ids = self.session.prompt_ids_for(text, engine, replacing=replacing)
        earlier = self._stop_reading_ahead()
        cancel = threading.Event()

        async def run() -> None:
            if earlier is not None:
                await asyncio.wait([earlier])
            try:
                await in_thread("read-ahead", lambda: engine.read_ahead(prompt_ids, cancel))
            except Exception:  # only a head start: the answer reads whatever the cache lacks
                traceback.print_exc()

        self._reading_ahead = (self.spawn(run()), cancel)

    def _stop_reading_ahead(self) -> asyncio.Task | None:
        """Tells the read-ahead to stop (within one pass); returns its task, to be awaited."""
        if self._reading_ahead is None:
            return None
        task, cancel = self._reading_ahead
        cancel.set()
        return task

    async def make_room(self) -> None:
        """Stops the read-ahead and waits for it (within one pass): the engine runs one job at a time."""
        task = self._stop_reading_ahead()
        self._reading_ahead = None
        if task is not None:
            await asyncio.wait([task])

    # ---- closing ----------------------------------------------------------------------------------
    def close(self) -> None:
        """The window closes: the answer stops at its next step and what it wrote is kept (marked
        interrupted). Deleted chats are forgotten and the caches saved for the next run on a
        thread (`closing`; the app waits for it before it exits), not on the window's loop."""
        self._closed = True
        self.models.closing()
        self._stop_reading_ahead()
        self._cancel.set()
        self._stop_waiting.set()
        self.session.interrupt()
        if self.engine is not None:
            engine = self.engine

            def save() -> None:
                self._forget_now(engine)  # before the caches are saved: a deleted chat's must not be
                engine.save_caches(wait_seconds=30)  # waits for the answer's last step to end

            self.closing = threading.Thread(target=save, name="closing: saving the caches")
            self.closing.start()

    # ---- helpers ----------------------------------------------------------------------------------
    def spawn(self, work: Coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(_report_crash)
        return task

    def _save(self, write) -> bool:
        try:
            write()
            return True
        except StoreError as error:
            self.error.emit("Could not save", str(error))
            return False

    def _report_save_errors(self) -> None:
        while self.session.errors:
            self.error.emit("Could not save", self.session.errors.pop(0))


def _report_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        traceback.print_exception(task.exception())
