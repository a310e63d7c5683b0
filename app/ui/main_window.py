"""The main window: builds the views and wires them to the chat controller, which owns the models,
the chat and the generation (chat/controller.py). Nothing here decides what to generate."""
from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QListWidgetItem, QMainWindow, QMessageBox

from ..chat.controller import ChatController
from ..chat.export import ChatFileError, from_json, to_json, to_markdown
from ..chat.presets import PresetBook
from ..chat.session import Overflow, RequestKind
from ..chat.store import ChatStore, StoreError
from ..engine.api import Source
from . import settings as window_settings
from .chat_list import WHEN_ROLE, day_words, forks_under_parents
from .event_loop import qt_event_loop
from .local_server import LocalServer
from .message_actions import MessageActions
from .model_dialog import missing_reason
from .model_loading import ModelLoading
from .presets import PresetPicker
from .token_html import RenderOptions, source_marks
from .theme import RESOURCES, SOURCE_HELP, THEMES
from .window_layout import CONVERSATION_HELP, build_layout

log = logging.getLogger("specchat.window")  # what the window does, for `python -m app --verbose`
READING_PROMPT = "Reading the prompt:"  # the status bar while a long prompt is read
READ_AHEAD_AFTER_MS = 400


class MainWindow(QMainWindow):
    models_ready = Signal()
    answer_finished = Signal()

    def __init__(self, store: ChatStore, settings: QSettings | None = None, load=None,
                 saved_caches: Path | None = None) -> None:
        """load: models.load_model's signature (its default); saved_caches: where the models'
        caches are kept between runs, so that a chat reopened after a restart is not read again
        (none: not kept)."""
        super().__init__()
        qt_event_loop()  # the controller's coroutines run on Qt's own loop
        self.store = store
        self.settings = settings or QSettings("SpecChat", "SpecChat")
        self.controller = ChatController(store, load, saved_caches)
        self.last_error: str | None = None  # the latest message shown in an error box
        self._send_when_ready = False  # a message sent while the models load goes as soon as they are there
        self._notice = ""  # the running answer's notice (controller.notice)
        self._render_timer = QTimer(self, singleShot=True, interval=40)
        self._render_timer.timeout.connect(self._render)
        # The message is read ahead this long after an edit, and then again at most this often while
        # typing goes on (each read-ahead keeps what the one before read that still holds)
        self._read_ahead_timer = QTimer(self, singleShot=True, interval=READ_AHEAD_AFTER_MS)
        self._read_ahead_timer.timeout.connect(self.read_ahead)

        self.setWindowTitle("SpecChat")
        self.setWindowIcon(QIcon(str(RESOURCES / "icon.png")))
        build_layout(self)
        self.messages = MessageActions(self)
        self.models = ModelLoading(self)
        self.server = LocalServer(self, self.controller, self.controls, self.settings, self.show_error)
        self.presets = PresetPicker(self, self.controls, self.controller, PresetBook(store.path.parent / "presets.json"),
                                    self.statusBar())
        self._build_menus()
        self.text_size = 0  # points added to the chat's and the message box's text (a setting)
        for source in self.settings.value("extra_models", [], list) or []:  # a file gone since is marked, not dropped
            self.controls.add_source(Path(source).name or source, source, missing=missing_reason(source))
        window_settings.restore(self.settings, window_settings.window_settings(self))
        reopened = self._reopen_last_chat()
        self.presets.chat_changed(reload=False)  # its context length is in the first load
        self._connect()
        self.apply_view_options()
        if reopened:
            self._show_chat()
            position = self.settings.value(window_settings.CHAT_POSITION, 1.0, float)
            QTimer.singleShot(0, lambda: self.chat_view.restore_position(position))
        self.refresh_chat_list()
        self.set_busy(False)
        if store.damaged_copy is not None:
            self.show_error("The chats were damaged", f"The file of chats could not be read ({store.damage}). It "
                            f"was moved aside, unchanged, to {store.damaged_copy}, and SpecChat started with a new one.")
        if self.presets.book.problem:
            self.show_error("The presets could not be read", f"{self.presets.book.problem} The file is left as it "
                            "is; the built-in presets are there.")
        crashed = self.controller.crashed_load()
        if crashed is not None:
            message, instead = crashed
            if instead is not None:
                self.controls.show_load_options(instead)
            self.show_error("SpecChat closed while loading models", message)
        self.load_models()
        QTimer.singleShot(0, self.composer.setFocus)  # type right away; the message waits for the models

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        file_menu.addAction("New chat", QKeySequence.New, self.new_chat)
        file_menu.addAction("Attach a file (text, PDF, DOCX, HTML)...", QKeySequence.Open, self.messages.choose_files)
        file_menu.addAction("Export chat as Markdown...", QKeySequence("Ctrl+E"), self.export_markdown)
        file_menu.addAction("Export chat as JSON (everything, to import)...", self.export_json)
        file_menu.addAction("Import chat...", QKeySequence("Ctrl+Shift+O"), self.import_chat)
        file_menu.addAction("Default system prompt...", self.edit_default_system_prompt)
        file_menu.addAction("Prepared models on disk...", self.models.show_prepared_models)
        file_menu.addAction("Get models...", QKeySequence("Ctrl+Shift+M"), self.models.show_models)
        file_menu.addAction("Download the default models...", self.models.offer_missing_defaults)
        file_menu.addSeparator()
        file_menu.addAction("Search chats", QKeySequence.Find, self.search.setFocus)
        file_menu.addAction("Rename chat...", QKeySequence("F2"), self.rename_chat)
        file_menu.addAction("Delete chat...", QKeySequence("Ctrl+Shift+D"), self.delete_chat)
        file_menu.addAction("Next chat", QKeySequence("Ctrl+PgDown"), lambda: self.open_next_chat(1))
        file_menu.addAction("Previous chat", QKeySequence("Ctrl+PgUp"), lambda: self.open_next_chat(-1))
        file_menu.addSeparator()
        file_menu.addAction("Quit", QKeySequence.Quit, self.close)
        view_menu = self.menuBar().addMenu("&View")
        self.dark_action = QAction("Dark theme", self, checkable=True)
        view_menu.addAction(self.dark_action)
        self.marks_action = QAction("Mark accepted tokens by a dotted underline", self, checkable=True)
        self.marks_action.setToolTip("Accepted tokens told apart other than by colour (corrected ones are "
                                     "underlined, bonus ones bold)")
        view_menu.addAction(self.marks_action)
        view_menu.addSeparator()
        larger = view_menu.addAction("Larger text", lambda: self.set_text_size(self.text_size + 1))
        larger.setShortcuts([QKeySequence.ZoomIn, QKeySequence("Ctrl+=")])  # Ctrl++ wants Shift on most layouts
        view_menu.addAction("Smaller text", QKeySequence.ZoomOut, lambda: self.set_text_size(self.text_size - 1))
        view_menu.addAction("Normal text size", QKeySequence("Ctrl+0"), lambda: self.set_text_size(0))
        chat_menu = self.menuBar().addMenu("&Chat")
        for entry in [("Stop", "Esc", self.stop), ("Regenerate the last answer", "Ctrl+R", self.regenerate),
                      ("Continue the last answer", "Ctrl+Shift+Return", self.continue_answer),
                      ("Answer the unanswered question", "Ctrl+Shift+R", self.answer_pending),
                      ("Edit your last message", "Ctrl+Shift+E", self.messages.edit_last),
                      ("Previous version of the last answer", "Alt+Left", lambda: self.messages.flip_version(-1)),
                      ("Next version of the last answer", "Alt+Right", lambda: self.messages.flip_version(1)), None,
                      ("Copy the last answer", "Ctrl+Shift+C", self.messages.copy_last_answer),
                      ("Copy the last code block", "Ctrl+Shift+K", self.messages.copy_last_code), None,
                      ("Compare with speculation off", "Ctrl+K", self.compare),
                      ("System prompt for this chat...", "Ctrl+Shift+P", self.edit_system_prompt), None]:
            if entry is None:
                chat_menu.addSeparator()
            else:
                chat_menu.addAction(entry[0], QKeySequence(entry[1]), entry[2])
        self.read_ahead_action = QAction("Read the message while it is typed", self, checkable=True, checked=True)
        self.read_ahead_action.setToolTip("The models read your message as you type it, so that its answer "
                                          "starts as soon as you send it (a pasted document too)")
        chat_menu.addAction(self.read_ahead_action)
        chat_menu.addAction(self.server.action)
        chat_menu.addAction(self.server.settings_action)
        self.presets.add_menu(self.menuBar().addMenu("&Presets"))

    def _connect(self) -> None:
        c, controller = self.controls, self.controller
        self.composer.send_requested.connect(self.send)
        self.composer.focused.connect(lambda: log.info("the message box has the keyboard focus"))
        self.statusBar().messageChanged.connect(lambda text: text and log.info("status: %s", text))
        self.chat_view.action_requested.connect(self.messages.on_message_action)
        self.chat_view.token_focused.connect(self._show_token_details)
        self.composer.stop_requested.connect(self.stop)
        self.composer.files_dropped.connect(self.messages.insert_files)
        self.composer.textChanged.connect(self._read_ahead_soon)
        self.send_button.clicked.connect(lambda: self.send(self.composer.toPlainText().strip()))
        self.stop_button.clicked.connect(self.stop)
        self.compare_button.clicked.connect(self.compare)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.continue_button.clicked.connect(self.continue_answer)
        for toggle in (self.colouring.toggled, self.ghosts.toggled, self.dark_action.toggled, self.marks_action.toggled):
            toggle.connect(self.apply_view_options)
        controller.session.thinking = c.thinking.isChecked()
        c.thinking.toggled.connect(lambda on: setattr(controller.session, "thinking", on))
        self.new_button.clicked.connect(self.new_chat)
        self.rename_button.clicked.connect(self.rename_chat)
        self.delete_button.clicked.connect(self.delete_chat)
        self.search.textChanged.connect(self.refresh_chat_list)
        self.chat_list.itemClicked.connect(lambda item: self.open_chat(item.data(Qt.UserRole)))
        controller.started.connect(lambda kind: (self._show_notice(""), self.set_busy(True)))
        controller.step.connect(self._on_step)
        controller.finished.connect(self._on_finished)
        controller.error.connect(self.show_error)
        controller.notice.connect(self._show_notice)
        controller.session.overflow = Overflow(c.overflow.currentData())
        c.overflow.currentIndexChanged.connect(lambda _: setattr(controller.session, "overflow",
                                                                 Overflow(c.overflow.currentData())))

    # ---- appearance ---------------------------------------------------------------------------
    def save_settings(self) -> None:
        window_settings.save(self.settings, window_settings.window_settings(self))
        # where the user was: the chat open (a new, unsaved one: none), and how far down it was read
        self.settings.setValue(window_settings.OPEN_CHAT, self.conversation.id if self.conversation.id is not None else -1)
        self.settings.setValue(window_settings.CHAT_POSITION, self.chat_view.position())
        self.settings.sync()

    def _reopen_last_chat(self) -> bool:
        """The chat open at the last exit, else (none, or deleted since) a new one."""
        chat_id = self.settings.value(window_settings.OPEN_CHAT, -1, int)
        try:
            if chat_id >= 0 and self.controller.open_chat(chat_id):
                log.info("reopened the last chat: %d messages", len(self.conversation.messages))
                return True
        except (StoreError, KeyError):  # damaged or gone: a new chat, as at a first start
            pass
        self.controller.new_chat(self.default_system_prompt())
        return False

    @property
    def theme(self):
        return THEMES["dark" if self.dark_action.isChecked() else "light"]

    def set_text_size(self, points: int) -> None:
        """The chat's and the message box's text `points` larger than the app's (-4 to +16)."""
        self.text_size = max(-4, min(16, points))
        font = QApplication.font()
        font.setPointSizeF(font.pointSizeF() + self.text_size)
        self.chat_view.document().setDefaultFont(font)
        # (a style sheet of its own: setFont gives way to the app's style sheet, set again with the theme)
        self.composer.setStyleSheet(f"font-size: {font.pointSizeF()}pt")

    def apply_view_options(self) -> None:
        theme = self.theme
        if QApplication.instance() is not None:
            QApplication.instance().setStyleSheet(theme.stylesheet())
        options = RenderOptions(theme, self.colouring.isChecked(), self.ghosts.isChecked(), self.marks_action.isChecked())
        self.chat_view.set_options(options)
        self.acceptance.set_colours(theme.accepted, theme.corrected)
        self.legend.setText("".join(
            f'<span style="color:{theme.colour(source)};{source_marks(Source(source), options)}">'
            f'&#9632;&nbsp;{source}</span>&nbsp;&nbsp; ' for source in SOURCE_HELP))
        self.legend.setToolTip("<br>".join(f"<b>{k}</b>: {v}" for k, v in SOURCE_HELP.items()))

    # ---- models ---------------------------------------------------------------------------------
    def load_models(self) -> None:
        self.models.load()

    def models_loaded(self) -> None:
        """The models are ready: a message sent while they loaded goes now."""
        if self._send_when_ready:
            self._send_when_ready = False
            self.send(self.composer.toPlainText().strip())
        else:
            self._read_ahead_timer.start()  # a message typed while the models loaded
        log.info("models ready")
        self.models_ready.emit()

    def models_failed(self, message: str) -> None:
        self._send_when_ready = False  # the message stays in the box
        self.show_error("Cannot use these models", message)

    # ---- chats ----------------------------------------------------------------------------------
    @property
    def conversation(self):
        return self.controller.conversation

    def refresh_chat_list(self) -> None:
        self.chat_list.clear()
        try:
            chats = self.store.list_chats(self.search.text())
        except StoreError as error:  # the file damaged or gone from under the app: said, the window goes on
            self.show_error("Could not read the chats", str(error))
            return
        try:
            forks = self.store.forks()
        except StoreError:
            forks = {}
        today = datetime.now().date()
        for chat_id, title, updated, depth in forks_under_parents(chats, forks):
            item = QListWidgetItem("\u21b3 " * depth + title)  # a fork under the chat it was made from
            item.setData(Qt.UserRole, chat_id)
            when = day_words(datetime.fromtimestamp(updated).date(), today)
            item.setData(WHEN_ROLE, when)
            item.setData(Qt.AccessibleTextRole, f"{title}, {'a fork, ' if depth else ''}{when}")
            self.chat_list.addItem(item)
            item.setSelected(chat_id == self.conversation.id)

    def chat_changed(self) -> None:
        self.messages.cancel_edit()
        self.presets.chat_changed()
        self._show_chat()
        self.refresh_chat_list()
        self.set_busy(False)
        self._read_ahead_timer.start()  # a message already typed goes to this chat now

    def _show_chat(self) -> None:
        self.chat_view.show_messages(self.conversation.messages)
        answer = self.controller.session.last_answer()
        if answer is not None:
            self.acceptance.show_stats(answer.stats)

    def new_chat(self) -> None:
        if self.controller.new_chat(self.default_system_prompt()):
            self.chat_changed()

    def open_chat(self, chat_id: int) -> None:
        try:
            opened = self.controller.open_chat(chat_id)
        except (StoreError, KeyError) as error:  # damaged, or deleted meanwhile
            self.show_error("Could not open the chat", str(error) if isinstance(error, StoreError) else
                            "It is no longer in the file of chats.")
            self.refresh_chat_list()
            return
        if opened:
            self.chat_changed()

    def _show_token_details(self, details: str) -> None:
        """The caret's token in words, also as the conversation's description: a screen reader says it."""
        self.token_details.setText(details)
        self.token_details.setVisible(bool(details))
        self.chat_view.setAccessibleDescription(details or CONVERSATION_HELP)

    def fork(self, index: int) -> None:
        """A new chat with the messages up to messages[index], opened."""
        if self.controller.fork(index):
            self.chat_changed()
            self.statusBar().showMessage(f"Forked: {self.conversation.title}", 5000)

    def open_next_chat(self, step: int) -> None:
        """The chat below (step 1) or above (-1) the open one in the list; from a new chat, the first."""
        ids = [self.chat_list.item(row).data(Qt.UserRole) for row in range(self.chat_list.count())]
        if not ids or self.controller.session.busy:
            return
        here = ids.index(self.conversation.id) if self.conversation.id in ids else -1 if step > 0 else len(ids)
        self.open_chat(ids[max(0, min(len(ids) - 1, here + step))])

    def rename_chat(self) -> None:
        if self.conversation.id is not None:
            title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=self.conversation.title)
            if ok:
                self.controller.rename_chat(title)
                self.refresh_chat_list()

    def delete_chat(self) -> None:
        if self.conversation.id is None or self.controller.session.busy:
            return
        if QMessageBox.question(self, "Delete chat", f"Delete '{self.conversation.title}'?") == QMessageBox.Yes:
            self.controller.delete_chat(self.default_system_prompt())
            self.chat_changed()

    def export_markdown(self, path: str | None = None) -> None:
        self._export(to_markdown, path, ".md", "Markdown (*.md)")

    def export_json(self, path: str | None = None) -> None:
        self._export(to_json, path, ".json", "SpecChat chat (*.json)")

    def _export(self, text_of, path: str | None, suffix: str, kind: str) -> None:
        """The chat as text_of(conversation) writes it, to `path` (None: the one the user picks)."""
        path = path or QFileDialog.getSaveFileName(self, "Export chat", f"{self.conversation.title}{suffix}", kind)[0]
        if path:
            try:
                Path(path).write_text(text_of(self.conversation), encoding="utf-8")
            except OSError as error:
                self.show_error("Export failed", f"Could not write {path}: {error}")

    def import_chat(self, path: str | None = None) -> None:
        """A chat exported as JSON, as a new chat, colours and versions as they were."""
        path = path or QFileDialog.getOpenFileName(self, "Import chat", "", "SpecChat chat (*.json)")[0]
        if not path:
            return
        try:
            conversation = from_json(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ChatFileError) as error:
            self.show_error("Cannot import the chat", f"{path}: {error}")
            return
        if self.controller.import_chat(conversation):
            self.chat_changed()

    def edit_system_prompt(self) -> None:
        text, ok = QInputDialog.getMultiLineText(self, "System prompt", "Sent before every message of this chat:",
                                                 self.conversation.system_prompt)
        if ok:
            self.controller.set_system_prompt(text.strip())

    def edit_default_system_prompt(self) -> None:
        text, ok = QInputDialog.getMultiLineText(self, "Default system prompt", "New chats start with:",
                                                 self.default_system_prompt())
        if ok:
            self.settings.setValue("system_prompt", text.strip())

    def default_system_prompt(self) -> str:
        return self.settings.value("system_prompt", "", str) or ""

    # ---- generation -----------------------------------------------------------------------------
    def set_busy(self, busy: bool) -> None:
        session, ready = self.controller.session, self.controller.engine is not None
        self.send_button.setEnabled((ready or self.controller.loading) and not busy)  # sent while loading: once ready
        self.compare_button.setEnabled(ready and not busy and session.last_answer() is not None
                                       and not self.controller.served_by)
        self.regenerate_button.setEnabled(ready and not busy and session.can_regenerate())
        self.continue_button.setEnabled(ready and not busy and session.can_continue())
        self.stop_button.setEnabled(busy)
        # Chats and models can be changed only between answers.
        c = self.controls
        for widget in (c.add_model, self.chat_list, self.new_button, self.delete_button, c.target, c.draft,
                       c.precision, c.draft_precision, c.kv_cache, c.context, c.device_choice, c.on_server,
                       self.presets.combo):  # (each may load the models again)
            widget.setEnabled(not busy)
        saved = self.conversation.id is not None  # a new chat is saved with its first message
        self.rename_button.setEnabled(saved)
        self.delete_button.setEnabled(saved and not busy)

    def send(self, text: str) -> None:
        controller = self.controller
        if not text or controller.session.busy:
            return
        if controller.engine is None:
            if controller.loading:
                self._send_when_ready = True
                log.info("message of %d characters waits for the models", len(text))
                self.statusBar().showMessage("The models are still loading: your message is sent as soon as they are "
                                             "ready (Esc keeps it here).")
            else:
                self.statusBar().showMessage("No models are loaded; your message stays in the box.", 5000)
            return
        log.info("message of %d characters sent", len(text))
        self.composer.clear()
        controller.ask(text, self.controls.generation_options(), replacing=self.messages.take_edit())
        self.chat_view.show_messages(self.conversation.messages, answer_follows=True)
        self.refresh_chat_list()

    def _read_ahead_soon(self) -> None:
        if not self._read_ahead_timer.isActive():  # restarted on every key, it would wait for a pause
            self._read_ahead_timer.start()

    def read_ahead(self) -> None:
        """Lets the models read the message typed so far, as sending it would give it to them."""
        if self.read_ahead_action.isChecked():
            self.controller.read_ahead(self.composer.toPlainText().strip(), replacing=self.messages.editing)

    def _ask(self, action, started: str = "") -> None:
        """Starts action(options) (the controller's answer_pending, regenerate, continue_answer,
        compare) and says `started`, or says why not while the models load."""
        if self.controller.engine is None and not self.controller.session.busy:
            self.statusBar().showMessage("The models are still loading; your message stays in the box.", 5000)
        elif action(self.controls.generation_options()) and started:
            self.statusBar().showMessage(started)

    def answer_pending(self) -> None:
        self._ask(self.controller.answer_pending)

    def regenerate(self) -> None:
        """Another answer to the last question with the current settings; earlier ones stay as versions."""
        self._ask(self.controller.regenerate)

    def continue_answer(self) -> None:
        """The last answer goes on from where it stopped, growing in place."""
        self._ask(self.controller.continue_answer)

    def compare(self) -> None:
        self._ask(self.controller.compare, "Comparing: the same prompt with speculation off...")

    def stop(self) -> None:
        self.messages.cancel_edit()
        if self._send_when_ready:
            self._send_when_ready = False
            self.statusBar().showMessage("Not sent: your message stays in the box.", 5000)
        if self.controller.stop():
            self.statusBar().showMessage("Stopping after this step...", 3000)

    def _show_notice(self, text: str) -> None:
        """What the user should know of the answer that starts (turns left out of its prompt) in the
        status bar, kept through the prompt's reading; "" clears it."""
        self._notice = text
        if text:
            self.statusBar().showMessage(text, 30000)
        else:
            self.statusBar().clearMessage()

    def _on_step(self, step) -> None:
        self.acceptance.show_estimated(step.estimated)
        if step.stats.prompt_read:  # a long prompt is still being read
            self.statusBar().showMessage(
                f"{READING_PROMPT} {step.stats.prompt_read:,} of {self.controller.prompt_tokens():,} tokens...")
        elif self.statusBar().currentMessage().startswith(READING_PROMPT):
            self._show_notice(self._notice)  # (the answer's notice again, if it has one)
        if not self._render_timer.isActive():
            self._render_timer.start()

    def _render(self) -> None:
        session = self.controller.session
        if session.builder is None:
            return
        self.acceptance.show_stats(session.builder.stats)
        if session.request.kind is not RequestKind.COMPARE:
            visible = session.visible_messages()
            self.chat_view.stream(visible[:-1], visible[-1])

    def _on_finished(self, changed, kind: RequestKind) -> None:
        self._render_timer.stop()
        if changed is not None:
            self.acceptance.show_stats(changed.stats)  # a comparison included, beside the run it compared
            if kind is RequestKind.COMPARE:
                self.statusBar().showMessage("Comparison done", 5000)
        self.chat_view.finish(self.conversation.messages)
        self.refresh_chat_list()
        self.models.show_memory()
        self.set_busy(False)
        self._read_ahead_timer.start()  # what was typed meanwhile
        log.info("answer finished")
        self.answer_finished.emit()

    def show_error(self, title: str, message: str) -> None:
        self.statusBar().showMessage(f"{title}: {message}", 10000)
        log.warning("error shown: %s: %s", title, message)
        box = QMessageBox(QMessageBox.Warning, title, message, QMessageBox.Ok, self)
        box.setModal(False)
        box.show()
        self.last_error = message

    def closeEvent(self, event: QCloseEvent) -> None:
        """Stop generation at the next step and keep what was generated so far."""
        self._read_ahead_timer.stop()
        self.server.switch(False)
        self.controller.close()
        self.save_settings()
        super().closeEvent(event)
