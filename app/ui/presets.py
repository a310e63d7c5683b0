"""The preset picker (in the corner of the controls' tabs) and the Presets menu: pick one for the
open chat, save the current settings as one, delete one, import and export them as JSON files.
The presets themselves are chat/presets.py's; the chat keeps the name of its own."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QComboBox, QFileDialog, QInputDialog, QMenu, QMessageBox, QStatusBar, QWidget

from ..chat.controller import ChatController
from ..chat.presets import BUILT_IN_NAMES, Preset, PresetBook, PresetError
from .controls import ControlsPanel, select_quietly

NO_PRESET = "No preset"


class PresetPicker:
    def __init__(self, parent: QWidget, controls: ControlsPanel, controller: ChatController, book: PresetBook,
                 status: QStatusBar) -> None:
        self.parent, self.controls, self.controller, self.book, self.status = parent, controls, controller, book, status
        self.combo = QComboBox()
        self.combo.setAccessibleName("Preset")
        self.combo.setToolTip("A system prompt and the settings of the Speculation, Sampling and Models tabs, for this\n"
                              "chat (Presets menu: save yours, import, export)")
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        controls.setCornerWidget(self.combo)
        self._fill()
        self.combo.activated.connect(lambda _: self.pick(self.combo.currentData()))
        self.delete_action = QAction("Delete this preset...", parent)
        self.delete_action.triggered.connect(self.delete_current)

    def add_menu(self, menu: QMenu) -> None:
        menu.addAction("Save the current settings as a preset...", self.save_current)
        menu.addAction(self.delete_action)
        menu.addSeparator()
        menu.addAction("Import presets...", self.import_file)
        menu.addAction("Export this preset...", self.export_current)

    def _fill(self) -> None:
        chosen = self.combo.currentData() or ""
        self.combo.blockSignals(True)
        self.combo.clear()
        self.combo.addItem(NO_PRESET, "")
        for name in self.book.names():
            self.combo.addItem(f"{name} (built in)" if name in BUILT_IN_NAMES else name, name)
        self.combo.blockSignals(False)
        select_quietly(self.combo, chosen)

    def _show(self, name: str) -> Preset | None:
        """The preset `name` in the picker ('' or a preset deleted since: none), and its menu's state."""
        preset = self.book.get(name) if name else None
        select_quietly(self.combo, preset.name if preset else "")
        self.delete_action.setEnabled(preset is not None and preset.name not in BUILT_IN_NAMES)
        return preset

    def _claim(self, preset: Preset | None) -> None:
        """The open chat takes the preset's name and its system prompt (one without keeps the chat's)."""
        system_prompt = self.controller.conversation.system_prompt
        self.controller.set_preset(preset.name if preset else "", preset and preset.system_prompt or system_prompt)

    def _apply(self, preset: Preset, reload: bool) -> None:
        """The controls take its settings; a context length other than the loaded one loads the
        models again when `reload`."""
        if self.controls.apply_preset(preset.model_dump()) and reload:
            self.controls.models_changed.emit()

    def pick(self, name: str) -> None:
        """The preset `name` ('' none) for the open chat: the controls take its settings, the chat
        its name and its system prompt."""
        preset = self._show(name)
        self._claim(preset)
        if preset is not None:
            self._apply(preset, reload=True)

    def chat_changed(self, reload: bool = True) -> None:
        """Another chat is open: its preset applies; a new chat takes the one picked before; a chat
        saved without one leaves the settings as they are. reload: whether a preset's context
        length may load the models again (not before the first load)."""
        conversation = self.controller.conversation
        name = conversation.preset
        if not name and conversation.id is None and not conversation.messages:
            name = self.combo.currentData() or ""
        preset = self._show(name)
        if preset is None:
            return
        if conversation.preset != preset.name:  # (a chat's own system prompt, edited since, stays)
            self._claim(preset)
        self._apply(preset, reload)

    def save_current(self, name: str | None = None) -> None:
        """The settings in the controls and the chat's system prompt saved as a preset (`name`
        None: asked for), then picked for the chat."""
        if name is None:
            current = self.combo.currentData()
            name, ok = QInputDialog.getText(self.parent, "Save as a preset", "Name:",
                                            text="" if current in BUILT_IN_NAMES else (current or ""))
            if not ok or not name.strip():
                return
        try:
            preset = Preset(name=name.strip(), system_prompt=self.controller.conversation.system_prompt,
                            **self.controls.preset_values())
            self.book.save(preset)
        except (PresetError, ValueError) as error:
            QMessageBox.warning(self.parent, "Cannot save the preset", str(error))
            return
        self._fill()
        self.pick(preset.name)
        self.status.showMessage(f"Saved the preset '{preset.name}'", 5000)

    def delete_current(self) -> None:
        name = self.combo.currentData()
        if not name:
            return
        if QMessageBox.question(self.parent, "Delete preset", f"Delete the preset '{name}'? Chats that use it keep "
                                "their settings.") != QMessageBox.Yes:
            return
        try:
            self.book.delete(name)
        except PresetError as error:
            QMessageBox.warning(self.parent, "Cannot delete the preset", str(error))
            return
        self._fill()
        self.pick("")

    def import_file(self, path: str | None = None) -> None:
        path = path or QFileDialog.getOpenFileName(self.parent, "Import presets", "", "SpecChat presets (*.json)")[0]
        if not path:
            return
        try:
            names = self.book.import_file(Path(path))
        except PresetError as error:
            QMessageBox.warning(self.parent, "Cannot import the presets", str(error))
            return
        self._fill()
        self.status.showMessage(f"Imported {len(names)} preset{'s' if len(names) != 1 else ''}: {', '.join(names)}", 8000)

    def export_current(self, path: str | None = None) -> None:
        name = self.combo.currentData()
        if not name:
            QMessageBox.information(self.parent, "Export a preset", "Pick a preset first (or save the current settings "
                                    "as one).")
            return
        path = path or QFileDialog.getSaveFileName(self.parent, "Export preset", f"{name}.json",
                                                   "SpecChat presets (*.json)")[0]
        if not path:
            return
        try:
            self.book.export_file([name], Path(path))
        except PresetError as error:
            QMessageBox.warning(self.parent, "Cannot export the preset", str(error))
