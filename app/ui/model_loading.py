"""The window's side of the models: a load for every change of the Models tab, its progress
dialog, what a loaded or failed pair says, models added to the pickers, the prepared copies on
disk, and the memory line."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QProgressDialog, QStatusBar

from ..chat.controller import ChatController, ModelsReady
from ..chat.model_library import ModelLibrary
from ..engine.api import LOOKUP, LoadOptions, ProposerKind
from .acceptance_view import AcceptanceView
from .controls import ControlsPanel
from .defaults_dialog import DefaultsDialog
from .model_dialog import AddModelDialog
from .models_dialog import DRAFTS_TAB, ModelsDialog
from .prepared_dialog import PreparedModelsDialog


class ModelsWindow(Protocol):
    """What the models' side uses of the window (a QMainWindow, also its dialogs' parent)."""

    controller: ChatController
    controls: ControlsPanel
    acceptance: AcceptanceView
    settings: QSettings

    def statusBar(self) -> QStatusBar: ...
    def set_busy(self, busy: bool) -> None: ...
    def show_error(self, title: str, message: str) -> None: ...
    def models_loaded(self) -> None: ...
    def models_failed(self, message: str) -> None: ...


class ModelLoading:
    def __init__(self, window: ModelsWindow) -> None:
        self.window = window
        self.progress: QProgressDialog | None = None
        controller, controls = window.controller, window.controls
        self.library = ModelLibrary(controller)
        self.models_dialog: ModelsDialog | None = None
        self.defaults_dialog: DefaultsDialog | None = None
        controls.models_changed.connect(self.load)
        controls.add_model_requested.connect(self.add_model)
        controls.get_models_requested.connect(self.show_models)
        controls.find_draft_requested.connect(self.find_best_draft)
        self.library.ranked.connect(lambda ranked: self.show_measured())
        controller.load_progress.connect(self._on_progress)
        controller.models_ready.connect(self._on_ready)
        controller.load_failed.connect(self._on_failed)
        controller.source_refused.connect(
            lambda source, reason, unreadable: (controls.mark_unreadable if unreadable else
                                                controls.mark_draft_incompatible)(source, reason))

    def load(self) -> None:
        chosen = self.window.controls.load_options()
        missing = self.library.missing_defaults(chosen)
        if missing:  # a first start without the default models' parts: offered for download first
            self.offer_defaults(missing)
            return
        self.window.controller.load(chosen)
        self._show_loading(chosen)

    def offer_missing_defaults(self) -> None:
        """The offer again (File > Download the default models..., after "Not now"), where the
        models picked are default ones not on this machine."""
        missing = self.library.missing_defaults(self.window.controls.load_options())
        if missing:
            self.offer_defaults(missing)
        else:
            self.window.statusBar().showMessage("The models picked are on this machine.", 5000)

    def offer_defaults(self, missing: list) -> DefaultsDialog:
        if self.defaults_dialog is None:  # one for the window: the library's events hold it
            self.defaults_dialog = DefaultsDialog(self.library, missing, self.window)
            self.defaults_dialog.accepted.connect(self.load)
            self.defaults_dialog.add_model.clicked.connect(self._add_instead_of_defaults)
        self.defaults_dialog.offer_models(missing)
        self.window.statusBar().showMessage("The default models are not on this machine")
        self.defaults_dialog.show()
        return self.defaults_dialog

    def _show_loading(self, chosen: LoadOptions) -> None:
        window = self.window
        window.set_busy(window.controller.session.busy)
        window.statusBar().showMessage(f"Connecting to {chosen.server}..." if chosen.server else
                                       f"Loading models: {chosen.target} + {chosen.draft}...")
        if self.progress is None:
            self.progress = QProgressDialog("Preparing models...", None, 0, 0, window)
            self.progress.setWindowTitle("SpecChat: preparing models")
            self.progress.setWindowModality(Qt.NonModal)
            self.progress.setMinimumDuration(800)

    def _on_progress(self, stage: str, fraction: float | None) -> None:
        if self.progress is not None:
            self.progress.setLabelText(stage)
            self.progress.setMaximum(0 if fraction is None else 100)
            self.progress.setValue(0 if fraction is None else int(fraction * 100))
            self.window.statusBar().showMessage(stage)

    def _done(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        self.window.set_busy(self.window.controller.session.busy)

    def _on_failed(self, message: str, retrying: LoadOptions | None) -> None:
        self._done()
        if self.window.controls.on_server.isChecked():
            self.window.controls.show_server_state("not connected", message)
        self.window.statusBar().showMessage("Models not loaded")
        if retrying is not None:  # the controller loads it
            self.window.controls.show_load_options(retrying)
            self._show_loading(retrying)
        self.window.models_failed(message)
        if retrying is None and self.library.missing_defaults(self.window.controls.load_options()):
            self.offer_missing_defaults()  # the default pair the window fell back to is not here either

    def _on_ready(self, ready: ModelsReady) -> None:
        self._done()
        window, controls = self.window, self.window.controls
        controls.show_device(ready.device, ready.on_gpu)
        controls.show_max_context(ready.max_context)
        controls.show_gpus(ready.gpus)
        if ready.new_target:
            controls.clear_draft_marks()  # they said which drafts the last target's vocabulary refused
        controls.thinking.setEnabled(ready.thinking_switchable)
        self.show_memory()
        served = ready.served
        window.acceptance.show_colours_note(served.colours_note if served else "")
        if served:
            controls.show_served(served.models, served.model, f"Connected. {served.colours_note}")
            window.statusBar().showMessage(f"Ready: {ready.target}", 5000)
        else:
            if controls.server_state.text() == "connected":  # (a failure's reason stays in view)
                controls.show_server_state("not connected")
            with_draft = f"with draft {ready.draft}" if ready.draft else "no draft model (prompt lookup)"
            window.statusBar().showMessage(f"Ready: {ready.target}, {with_draft}", 5000)
        if ready.draft_refused:  # a target of another family than the draft: it runs alone
            controls.mark_draft_incompatible(ready.chosen.draft, ready.draft_refused)
            window.show_error("The draft cannot draft for this target",
                              f"{ready.draft_refused.rstrip('.')}. Meanwhile {ready.target} runs alone, speculating "
                              "by prompt lookup (copying from the conversation).")
        self.show_measured()
        if self.models_dialog is not None and self.models_dialog.tabs.currentIndex() == DRAFTS_TAB:
            self.models_dialog.refresh_drafts()
        window.models_loaded()

    def add_model(self) -> str | None:
        settings = self.window.settings
        dialog = AddModelDialog(self.window, settings.value("model_folder", "", str))
        if dialog.exec() != AddModelDialog.Accepted:
            return None
        source = dialog.chosen()
        if Path(source).expanduser().exists():
            settings.setValue("model_folder", str(Path(source).expanduser().resolve().parent))
        self.add_model_source(source)
        return source

    def _add_instead_of_defaults(self) -> None:
        """A model from disk in place of the default pair: it runs alone, speculating by prompt
        lookup (loaded once, as the target and as the draft picker's choice), until a draft is picked."""
        source = self.add_model()
        if source is None:
            return
        self.defaults_dialog.reject()
        controls = self.window.controls
        controls.proposer.setCurrentIndex(controls.proposer.findData(ProposerKind.PROMPT_LOOKUP))
        for combo, value in ((controls.draft, source), (controls.target, source),
                             (controls.draft_precision, controls.precision.currentData())):  # the same copy
            combo.blockSignals(True)  # one load for the changes
            combo.setCurrentIndex(combo.findData(value))
            combo.blockSignals(False)
        self.load()

    def add_model_source(self, source: str) -> None:
        """Adds a model to both pickers; the controller flags it as a draft when its vocabulary
        differs from the target's, and in both when its tokenizer cannot be read."""
        self.window.controls.add_source(Path(source).name or source, source)
        extra = self._added_sources()
        if source not in extra:
            self.window.settings.setValue("extra_models", [*extra, source])
        self.window.controller.check_source(source)

    def show_prepared_models(self) -> PreparedModelsDialog:
        """The copies models' first starts wrote, with Delete for those neither loaded nor loading now
        (modal in use; returned shown for tests)."""
        in_use = self.window.controller.models_in_use(self.window.controls.load_options())
        dialog = PreparedModelsDialog(self.window, in_use)
        dialog.open()
        return dialog

    def show_memory(self) -> None:
        memory = self.window.controller.memory()
        if memory is not None:
            self.window.acceptance.show_memory(*memory)

    # ---- Get models, pairing and the draft finder -------------------------------------------------
    def show_models(self, tab: int = 0) -> ModelsDialog:
        """The Models dialog (non-modal, one per window) on `tab`; returned shown for tests."""
        if self.models_dialog is None:
            dialog = self.models_dialog = ModelsDialog(self.library, self.window.controls.draft_sources,
                                                       self._added_sources, self.window)
            dialog.use_as_target.connect(self.use_as_target)
            dialog.use_as_draft.connect(self.use_as_draft)
            dialog.add_to_pickers.connect(lambda sources: [self.add_model_source(source) for source in sources])
            dialog.remove_from_pickers.connect(lambda sources: self.forget_sources(sources, deleted=False))
            dialog.deleted.connect(self.forget_sources)
        unchanged = self.models_dialog.tabs.currentIndex() == tab
        self.models_dialog.tabs.setCurrentIndex(tab)  # a change to the Drafts tab checks its drafts
        if unchanged and tab == DRAFTS_TAB:
            self.models_dialog.refresh_drafts()
        self.models_dialog.show()
        self.models_dialog.raise_()
        return self.models_dialog

    def find_best_draft(self) -> ModelsDialog:
        """The Drafts tab, its drafts checked, then each compatible one measured."""
        dialog = self.show_models(DRAFTS_TAB)
        dialog.rank_when_listed = True
        return dialog

    def show_measured(self) -> None:
        controls = self.window.controls
        controls.show_measured(self.library.measured_speedups(controls.draft_sources()))

    def use_as_target(self, source: str) -> None:
        controls = self.window.controls
        if controls.target.findData(source) < 0:
            self.add_model_source(source)
        controls.target.setCurrentIndex(controls.target.findData(source))  # loads it

    def use_as_draft(self, source: str) -> None:
        """A draft model, or LOOKUP: prompt lookup with no draft model (no load needed)."""
        controls = self.window.controls
        controls.speculative.setChecked(True)
        if source == LOOKUP:
            controls.proposer.setCurrentIndex(controls.proposer.findData(ProposerKind.PROMPT_LOOKUP))
            return
        controls.proposer.setCurrentIndex(controls.proposer.findData(ProposerKind.DRAFT_MODEL))
        if controls.draft.findData(source) < 0:
            self.add_model_source(source)
        controls.draft.setCurrentIndex(controls.draft.findData(source))  # loads the pair

    def forget_sources(self, sources: list[str], deleted: bool = True) -> None:
        """Models out of the pickers and of the models the window remembers; the ones in use stay,
        marked when their files were deleted."""
        self.window.settings.setValue("extra_models", [s for s in self._added_sources() if s not in sources])
        for source in sources:
            self.window.controls.remove_source(source, "deleted from disk" if deleted else None)

    def _added_sources(self) -> list[str]:
        return self.window.settings.value("extra_models", [], list) or []
