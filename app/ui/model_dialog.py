"""The Add model dialog: a .gguf file or a model folder picked from disk, or a hub id typed."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPushButton,
                               QVBoxLayout, QWidget)


class AddModelDialog(QDialog):
    """The source stays in the box until it names something that can be loaded: a path that does
    not exist says so there instead of joining the pickers."""

    def __init__(self, parent: QWidget | None = None, start_folder: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle("Add model")
        self.start_folder = start_folder or str(Path.home())
        self.source = QLineEdit()
        self.source.setPlaceholderText("/path/to/model.gguf, a model folder, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct")
        self.source.setMinimumWidth(480)
        choose_file, choose_folder = QPushButton("Choose file..."), QPushButton("Choose folder...")
        choose_file.clicked.connect(self.choose_file)
        choose_folder.clicked.connect(self.choose_folder)
        self.problem = QLabel()
        self.problem.setObjectName("problem")
        self.problem.setStyleSheet("color: #c0392b")
        self.problem.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.source.textChanged.connect(self._edited)
        self._edited("")

        pickers = QHBoxLayout()
        pickers.addWidget(choose_file)
        pickers.addWidget(choose_folder)
        pickers.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("A GGUF file, a Hugging Face model folder, or a hub id already in the local cache:"))
        layout.addWidget(self.source)
        layout.addLayout(pickers)
        layout.addWidget(self.problem)
        layout.addWidget(self.buttons)

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a model file", self.start_folder,
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.source.setText(path)

    def choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a model folder", self.start_folder)
        if path:
            self.source.setText(path)

    def chosen(self) -> str:
        return self.source.text().strip()

    def accept(self) -> None:
        reason = missing_reason(self.chosen())
        if reason:
            self.problem.setText(reason)
            self.problem.show()
            return
        super().accept()

    def _edited(self, text: str) -> None:
        self.problem.hide()
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(bool(text.strip()))


def missing_reason(source: str) -> str | None:
    """Why a source that reads as a local path cannot be added (None for one that exists, and for a
    hub id: only loading it can tell whether the local cache holds it)."""
    path = Path(source).expanduser()
    looks_local = path.is_absolute() or source.startswith(("~", ".")) or path.suffix.lower() == ".gguf" or source.count("/") > 1
    if not looks_local or path.exists():
        return None
    return f"No such file or folder: {path}"
