"""Starting the desktop app (Qt's loop, which drives the window's asyncio loop through qasync:
ui/event_loop.py) and the offscreen screenshot mode."""
from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

from .theme import RESOURCES


def _application():
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("SpecChat")
    app.setOrganizationName("SpecChat")
    app.setWindowIcon(QIcon(str(RESOURCES / "icon.png")))
    return app


def close_on_signals(window) -> None:
    """Ctrl+C in the terminal that started the app (SIGINT) and SIGTERM (`kill`, a logout) close
    the window as its close button does: the answer being written is kept, the settings saved.
    Python runs a signal's handler only when the interpreter next runs, which Qt's idle event loop
    never lets it do (Ctrl+C did nothing): the signal's wake-up byte wakes the loop instead."""
    from PySide6.QtCore import QSocketNotifier

    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno())
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, window)
    notifier.activated.connect(lambda: reader.recv(64))  # the handler runs as this returns to Qt
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: window.close())
    window.signal_wakeup = (reader, writer, notifier)  # alive as long as the window


def leave_work_behind(settings) -> None:
    """Ends the process at once when the app's own threads still run at exit: a model load (the
    window closed while the models load), a kernel build, an answer that did not stop in time. The
    interpreter's shutdown would tear them down inside torch's import or its thread pool: an abort
    ("terminate called without an active exception") or tracebacks at every such exit. What is
    worth keeping is on disk by then (the chats closed, the caches saved, the settings synced here),
    and what those threads write appears only complete (written beside, then renamed)."""
    if any(thread.name.startswith("specchat-") and thread.is_alive() for thread in threading.enumerate()):
        settings.sync()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_gui() -> int:
    from .platform_check import xcb_problem

    problem = xcb_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 1

    from PySide6.QtWidgets import QMessageBox

    from ..chat.store import ChatStore, StoreError, default_path
    from ..engine.api import cache_root
    from .main_window import MainWindow
    from .single_instance import SingleInstance

    app = _application()
    instance = SingleInstance(default_path().parent)
    if not instance.acquire():
        brought = instance.knock()
        print(f"SpecChat is already running with the chats in {instance.folder}"
              + (": its window was brought to the front." if brought else "."), file=sys.stderr)
        return 0
    try:
        store = ChatStore()
    except StoreError as error:  # an unreadable folder, a full disk: said, and nothing touched
        print(f"error: {error}", file=sys.stderr)
        QMessageBox.critical(None, "SpecChat cannot start", str(error))
        return 1
    window = MainWindow(store, saved_caches=cache_root() / "saved-caches")  # its work runs on Qt's loop (qasync)
    instance.serve(window)
    close_on_signals(window)
    window.show()
    app.exec()
    if window.controller.closing is not None:  # the caches being saved for the next run
        window.controller.closing.join(60)
    window.store.close()
    leave_work_behind(window.settings)
    return 0


def run_screenshot(path: Path, prompt: str, dark: bool = False) -> int:
    """One chat turn with the current settings, offscreen; saves a PNG of the window."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSettings, QTimer

    from ..chat.store import ChatStore
    from .main_window import MainWindow
    from .settings import LAYOUT_KEYS
    from .window_layout import DEFAULT_SIZE

    app = _application()
    workdir = Path(tempfile.mkdtemp(prefix="specchat-shot-"))
    settings = QSettings(str(workdir / "settings.ini"), QSettings.IniFormat)
    for key in QSettings("SpecChat", "SpecChat").allKeys():  # the user's settings, left untouched
        if key not in LAYOUT_KEYS:  # a screenshot is taken at the default size
            settings.setValue(key, QSettings("SpecChat", "SpecChat").value(key))
    if dark:
        settings.setValue("theme", "dark")
    window = MainWindow(ChatStore(workdir / "chats.sqlite3"), settings)
    if window.models.defaults_dialog is not None:  # no one to answer its offer (the command line fetches them first)
        print("error: the default models are not on this machine", file=sys.stderr)
        return 2
    window.resize(*DEFAULT_SIZE)  # whatever the offscreen screen's size
    window.show()
    outcome = {"code": 1}

    def save() -> None:
        window.chat_view.verticalScrollBar().setValue(window.chat_view.verticalScrollBar().maximum())
        saved = window.grab().save(str(path))
        print(f"wrote {path}" if saved else f"error: could not write {path}", file=sys.stderr)
        outcome["code"] = 0 if saved else 1
        window.close()
        app.quit()

    def failed() -> None:
        print(f"error: {getattr(window, 'last_error', 'unknown error')}", file=sys.stderr)
        outcome["code"] = 2
        app.quit()

    window.models_ready.connect(lambda: window.send(prompt))
    window.answer_finished.connect(lambda: QTimer.singleShot(200, save))
    window.controller.load_failed.connect(lambda *_: QTimer.singleShot(0, failed))
    app.exec()
    return outcome["code"]
