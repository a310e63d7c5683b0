"""The window's settings, saved at exit and restored at start from one table: each row a key, its
type, how to read it from the window and how to put it back. A key never saved leaves the
widget's own value, which is the shared default."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QCheckBox, QPlainTextEdit, QSplitter

from ..engine.api import ProposerKind
from .controls import ControlsPanel, select_quietly

WINDOW_GEOMETRY = "geometry"
SPLITTER_KEYS = ("columns", "right_column")
LAYOUT_KEYS = (WINDOW_GEOMETRY, *SPLITTER_KEYS)  # the settings that place the window
OPEN_CHAT, CHAT_POSITION = "open_chat", "chat_position"  # the chat reopened at the next start, and where


@dataclass(frozen=True)
class Setting:
    key: str
    kind: type
    read: Callable[[], object]
    write: Callable[[object], None]


class SettingsWindow(Protocol):
    """What the settings read and restore of the window (a QMainWindow: its geometry too)."""

    controls: ControlsPanel
    composer: QPlainTextEdit
    colouring: QCheckBox
    ghosts: QCheckBox
    dark_action: QAction
    read_ahead_action: QAction
    marks_action: QAction
    splitters: dict[str, QSplitter]
    text_size: int

    @property
    def theme(self): ...
    def set_text_size(self, points: int) -> None: ...
    def saveGeometry(self) -> QByteArray: ...
    def restoreGeometry(self, geometry: QByteArray) -> bool: ...


def window_settings(window: SettingsWindow) -> list[Setting]:
    c = window.controls

    def checkbox(key, box):
        return Setting(key, bool, box.isChecked, box.setChecked)

    def spin(key, box, kind):
        return Setting(key, kind, box.value, box.setValue)

    return [
        # the model pickers first and quietly: one model load after all of them, not one per picker
        *(Setting(key, str, combo.currentData, lambda value, combo=combo: select_quietly(combo, value))
          for combo, key in c.load_pickers()),
        Setting("server_url", str, c.server_url.text, c.server_url.setText),
        Setting("server_model", str, c.server_model.currentText, c.server_model.setCurrentText),
        Setting("on_server", bool, c.on_server.isChecked, c.set_on_server_quietly),
        checkbox("speculative", c.speculative), spin("k", c.k, int), checkbox("adaptive", c.adaptive),
        checkbox("lookup", c.lookup),
        Setting("proposer", str, lambda: ProposerKind(c.proposer.currentData()).value,
                lambda value: c.proposer.setCurrentIndex(max(c.proposer.findData(ProposerKind(value)), 0))),
        spin("temperature", c.temperature, float), spin("top_k", c.top_k, int), spin("top_p", c.top_p, float),
        spin("min_p", c.min_p, float), spin("repeat_penalty", c.repeat_penalty, float),
        Setting("context_length", int, c.context.value, c.set_context_quietly),
        Setting("device", str, c.device_choice.currentData, c.select_device),
        Setting("overflow", str, c.overflow.currentData, lambda value: select_quietly(c.overflow, value)),
        spin("max_new_tokens", c.max_new_tokens, int), spin("sampling_seed", c.seed, int), checkbox("thinking", c.thinking),
        checkbox("colouring", window.colouring), checkbox("ghosts", window.ghosts),
        Setting("theme", str, lambda: window.theme.name, lambda value: window.dark_action.setChecked(value == "dark")),
        checkbox("read_ahead", window.read_ahead_action), checkbox("marks", window.marks_action),
        Setting("text_size", int, lambda: window.text_size, window.set_text_size),
        Setting("message", str, window.composer.toPlainText, window.composer.setPlainText),  # typed, not sent
        Setting(WINDOW_GEOMETRY, QByteArray, window.saveGeometry, window.restoreGeometry),
        *(Setting(key, QByteArray, splitter.saveState, splitter.restoreState)
          for key, splitter in window.splitters.items()),
    ]


def restore(settings: QSettings, table: list[Setting]) -> None:
    for setting in table:
        if settings.contains(setting.key):
            value = settings.value(setting.key) if setting.kind is QByteArray else \
                settings.value(setting.key, setting.read(), setting.kind)
            setting.write(value)


def save(settings: QSettings, table: list[Setting]) -> None:
    for setting in table:
        settings.setValue(setting.key, setting.read())
    settings.sync()
