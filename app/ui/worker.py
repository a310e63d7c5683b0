"""Background work: the engine's steps and model loading run on Python threads and reach
the UI thread through queued Qt signals, so the window never blocks."""
from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from ..engine.engine import GenerationOptions, SpeculativeEngine


class GenerationWorker(QObject):
    step = Signal(object)  # engine Step
    finished = Signal()
    failed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.cancel = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, engine: SpeculativeEngine, prompt_ids: list[int], options: GenerationOptions) -> None:
        self.cancel = threading.Event()
        cancel = self.cancel

        def work() -> None:
            try:
                for step in engine.generate(prompt_ids, options, cancel):
                    self.step.emit(step)
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
