"""The first start's offer: the default models are not on this machine, so the window offers to
download them (their size and where they go), shows the download's progress, speed and time left,
and can cancel it (the next download continues) or add a model file from disk instead."""
from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from ..chat.model_library import ModelLibrary
from .models_dialog import duration_words


class DefaultsDialog(QDialog):
    def __init__(self, library: ModelLibrary, models: list, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.library, self.models = library, models
        self.setWindowTitle("SpecChat: download the default models")
        layout = QVBoxLayout(self)
        self.offer = QLabel(library.offer_in_words(models))
        self.offer.setWordWrap(True)
        self.offer.setAccessibleName("What the download brings")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.progress.setAccessibleName("Download progress")
        self.state = QLabel("Download them now, or add a model file you have (.gguf, or a model folder).")
        self.state.setWordWrap(True)
        self.state.setAccessibleName("Download state")
        buttons = QDialogButtonBox()
        self.download = QPushButton("Download")
        self.download.setDefault(True)
        self.cancel = QPushButton("Cancel download")
        self.add_model = QPushButton("Add model...")
        self.later = QPushButton("Not now")
        for button in (self.download, self.cancel, self.add_model, self.later):
            buttons.addButton(button, QDialogButtonBox.ActionRole)
        for widget in (self.offer, self.progress, self.state, buttons):
            layout.addWidget(widget)
        self.download.clicked.connect(self.start)
        self.cancel.clicked.connect(library.cancel_pull)
        self.later.clicked.connect(self.reject)
        library.defaults_progress.connect(self._show_progress)
        library.defaults_stopped.connect(self._stopped)
        library.defaults_fetched.connect(lambda names: self.accept())
        self._buttons(running=False)
        self.resize(560, self.sizeHint().height())

    def offer_models(self, models: list) -> None:
        """The models to offer now (the window offers again when another choice misses one)."""
        self.models = models
        self.offer.setText(self.library.offer_in_words(models))

    def start(self) -> None:
        if self.library.fetch_defaults(self.models):
            self.state.setText("Connecting...")
            self._buttons(running=True)
        else:
            self.state.setText("Another download is running (File > Get models...): download these once it ends.")

    def _show_progress(self, name: str, progress) -> None:
        if progress.total:
            self.progress.setValue(int(1000 * progress.done / progress.total))
        position = next((f" ({number} of {len(self.models)})" for number, packaged in enumerate(self.models, 1)
                         if packaged.name == name), "") if len(self.models) > 1 else ""
        # decimal units, as the offer above names the sizes
        self.state.setText(f"{name}{position}: {progress.done / 1e6:,.0f} MB of {(progress.total or 0) / 1e6:,.0f} MB, "
                           f"{progress.bytes_per_second / 1e6:,.0f} MB/s, {duration_words(progress.seconds_left)}")

    def _stopped(self, message: str) -> None:
        self.state.setText(message)
        self._buttons(running=False)
        self.download.setText("Download again")

    def _buttons(self, running: bool) -> None:
        self.download.setEnabled(not running)
        self.cancel.setEnabled(running)
        self.add_model.setEnabled(not running)

    def done(self, result: int) -> None:
        self.library.cancel_pull()  # closed while it runs: what was fetched stays for the next start
        super().done(result)
