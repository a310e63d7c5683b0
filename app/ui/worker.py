"""Background work: the engine's steps and model loading run on Python threads and reach
the UI thread through queued Qt signals, so the window never blocks."""
from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from ..engine.choices import GenerationOptions
from ..engine.errors import PromptTooLongError

if TYPE_CHECKING:
    from ..engine.engine import SpeculativeEngine


class GenerationWorker(QObject):
    step = Signal(object)  # engine Step
    finished = Signal()
    failed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.cancel = threading.Event()
        self.thread: threading.Thread | None = None
        self._ahead: tuple[threading.Thread, threading.Event] | None = None  # the read-ahead, if any

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def read_ahead(self, engine: SpeculativeEngine, prompt_ids: list[int]) -> None:
        """Reads the message being typed into the target's cache meanwhile (SpeculativeEngine.read_ahead),
        after stopping the read-ahead before it; an answer started later waits for it to stop."""
        if self.running:
            return
        earlier = self._take_read_ahead()
        cancel = threading.Event()

        def work() -> None:
            if earlier is not None:
                earlier.join()
            try:
                engine.read_ahead(prompt_ids, cancel)
            except Exception:  # only a head start: the answer reads whatever the cache lacks
                traceback.print_exc()

        thread = threading.Thread(target=work, name="specchat-read-ahead", daemon=True)
        self._ahead = (thread, cancel)
        thread.start()

    def stop_reading_ahead(self, wait_seconds: float = 0.0) -> None:
        """Tells the read-ahead to stop (within one pass), and waits up to wait_seconds for it."""
        if self._ahead is not None:
            self._ahead[1].set()
            self._ahead[0].join(wait_seconds)

    def _take_read_ahead(self) -> threading.Thread | None:
        """The read-ahead thread, told to stop (the caller waits for it off the UI thread)."""
        self.stop_reading_ahead()
        ahead, self._ahead = self._ahead, None
        return ahead[0] if ahead is not None else None

    def start(self, engine: SpeculativeEngine, prompt_ids: list[int], options: GenerationOptions) -> None:
        self.cancel = threading.Event()
        cancel = self.cancel
        reading_ahead = self._take_read_ahead()

        def work() -> None:
            try:
                if reading_ahead is not None:  # it stops within one pass; the engine runs one job at a time
                    reading_ahead.join()
                for step in engine.generate(prompt_ids, options, cancel):
                    self.step.emit(step)
            except PromptTooLongError as error:  # a refusal, said in the dialog: no traceback
                self.failed.emit(str(error))
            except Exception as error:  # shown in a dialog; the traceback goes to the log
                traceback.print_exc()
                self.failed.emit(str(error))
            finally:
                self.finished.emit()

        self.thread = threading.Thread(target=work, name="specchat-generate", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.cancel.set()

    def wait(self, seconds: float) -> bool:
        if self.thread is not None:
            self.thread.join(seconds)
        return not self.running


class Loader(QObject):
    """Runs one loading job at a time off the UI thread."""

    progress = Signal(str, float)  # stage, fraction (-1 when unknown)
    loaded = Signal(object)
    failed = Signal(str)

    def run(self, job: Callable[[Callable[[str, float | None], None]], object]) -> None:
        def report(stage: str, fraction: float | None) -> None:
            self.progress.emit(stage, -1.0 if fraction is None else fraction)

        def work() -> None:
            try:
                self.loaded.emit(job(report))
            except Exception as error:
                traceback.print_exc()
                self.failed.emit(str(error))

        threading.Thread(target=work, name="specchat-load", daemon=True).start()
