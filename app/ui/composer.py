"""The message box: Enter sends, Shift+Enter inserts a newline, Esc stops generation."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit


class Composer(QPlainTextEdit):
    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line, Esc stops)")
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
