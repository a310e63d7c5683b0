"""The message box: Enter sends, Shift+Enter inserts a newline, Esc stops generation; text files
dropped or pasted into it are offered to the window to insert as code blocks."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QFocusEvent, QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit


class Composer(QPlainTextEdit):
    send_requested = Signal(str)
    stop_requested = Signal()
    files_dropped = Signal(list)  # [Path]: local files dropped or pasted
    focused = Signal()  # the keyboard's input now comes here

    def __init__(self) -> None:
        super().__init__()
        self.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line, Esc stops; drop a file or a PDF, DOCX or HTML document to attach it)")
        self.setFixedHeight(84)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not event.modifiers() & Qt.ShiftModifier:
            text = self.toPlainText().strip()
            if text:
                self.send_requested.emit(text)
            return
        if event.key() == Qt.Key_Escape:
            self.stop_requested.emit()
            return
        super().keyPressEvent(event)

    def focusInEvent(self, event: QFocusEvent) -> None:
        super().focusInEvent(event)
        self.focused.emit()

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return bool(_local_files(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        files = _local_files(source)
        if files:
            self.files_dropped.emit(files)
        else:
            super().insertFromMimeData(source)


def _local_files(source: QMimeData) -> list[Path]:
    return [Path(url.toLocalFile()) for url in source.urls() if url.isLocalFile()] if source.hasUrls() else []
