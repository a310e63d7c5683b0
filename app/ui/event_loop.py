"""The asyncio loop the window's work runs on: qasync's, which is Qt's own event loop, so a
coroutine's callbacks run wherever Qt's loop runs (app.exec(), a modal dialog, pytest-qt's waits),
on the window's thread, and a later local server can share it."""
from __future__ import annotations

import asyncio


def qt_event_loop() -> asyncio.AbstractEventLoop:
    """The running loop of this thread; else a qasync loop over the QApplication, marked running
    (Qt's loop drives it from its first exec(); the process's end stops it)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        import qasync
        from PySide6.QtWidgets import QApplication

        loop = qasync.QEventLoop(QApplication.instance(), already_running=True)
        asyncio.set_event_loop(loop)
        return loop
