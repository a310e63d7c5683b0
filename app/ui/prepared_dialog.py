"""File > Prepared models on disk...: the copies that models' first starts wrote to the cache
folder, with their sizes and last use, and Delete for those the window is not using now."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QDialogButtonBox, QHeaderView, QLabel, QPushButton,
                               QTableWidget, QTableWidgetItem, QVBoxLayout)

from ..engine.api import (DEFAULT_MODELS, Precision, PreparedCopy, age_in_words, delete_prepared_copy, float_model,
                          prepared_copies, prepared_folder)
from .controls import PRECISION_LABELS

COLUMNS = ["Model", "Precision", "Size", "Last used", "Made from"]


def gigabytes(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


class PreparedModelsDialog(QDialog):
    def __init__(self, parent=None, in_use: frozenset[tuple[str, str]] = frozenset()) -> None:
        """in_use: (source, precision) of the models loaded or loading now, as prepared copies note them."""
        super().__init__(parent)
        self.setWindowTitle("Prepared models on disk")
        self.in_use = in_use
        self.copies: list[PreparedCopy] = []
        layout = QVBoxLayout(self)
        explanation = QLabel("A model's first start prepares a copy of it here, so that later starts take seconds. "
                             "A deleted copy is prepared again the next time its model is chosen; a copy whose file "
                             "is gone cannot be used again.")
        explanation.setWordWrap(True)
        layout.addWidget(explanation)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        layout.addWidget(self.table)
        self.summary = QLabel()
        self.summary.setTextInteractionFlags(Qt.TextSelectableByMouse)
        layout.addWidget(self.summary)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        self.delete_button = QPushButton("Delete")
        buttons.addButton(self.delete_button, QDialogButtonBox.ActionRole)
        self.delete_button.clicked.connect(self.delete_selected)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(860, 360)
        self.refresh()

    def refresh(self, problem: str = "") -> None:
        self.copies = prepared_copies()
        self.table.setRowCount(len(self.copies))
        for row, copy in enumerate(self.copies):
            used = copy.source is not None and (copy.source, copy.precision) in self.in_use
            cells = [model_name(copy) + ("  (in use)" if used else ""), precision_label(copy),
                     gigabytes(copy.size), age_in_words(copy.last_used), made_from(copy)]
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(str(copy.path))
                if used:  # in memory or being read: not offered for deletion
                    item.setFlags(item.flags() & ~Qt.ItemIsSelectable)
                if column == 2:
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(row, column, item)
        total = sum(copy.size for copy in self.copies)
        self.summary.setText((problem + "\n" if problem else "") +
                             f"{len(self.copies)} {'copy' if len(self.copies) == 1 else 'copies'}, {gigabytes(total)} "
                             f"in {prepared_folder()}")
        self._selection_changed()

    def selected(self) -> list[PreparedCopy]:
        return [self.copies[index.row()] for index in self.table.selectionModel().selectedRows()]

    def _selection_changed(self) -> None:
        self.delete_button.setEnabled(bool(self.selected()))

    def delete_selected(self) -> None:
        problems = []
        for copy in self.selected():
            try:
                delete_prepared_copy(copy)
            except OSError as error:
                problems.append(f"Could not delete {copy.path.name}: {error}")
        self.refresh("\n".join(problems))


def model_name(copy: PreparedCopy) -> str:
    if copy.source in DEFAULT_MODELS:
        return DEFAULT_MODELS[copy.source].name + " (default)"
    return Path(copy.source).name if copy.source else copy.path.name


def precision_label(copy: PreparedCopy) -> str:
    try:
        precision = Precision(copy.precision)
    except ValueError:
        return ""
    from_floats = copy.source is not None and float_model(copy.source)
    return "8-bit" if from_floats and precision is Precision.LOWBIT else PRECISION_LABELS[precision]


def made_from(copy: PreparedCopy) -> str:
    if copy.source is None:
        return "a GGUF file assembled from the installed parts" if copy.path.suffix == ".gguf" else \
            "unknown (prepared by an earlier version)"
    if copy.source in DEFAULT_MODELS:
        return "the installed parts"
    return copy.source + ("  (file not found)" if copy.source_missing else "")
