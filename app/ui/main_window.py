"""The main window: sidebar of chats, conversation and composer, controls and acceptance."""
from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (QApplication, QCheckBox, QFileDialog, QFrame, QHBoxLayout, QInputDialog, QLabel,
                               QLineEdit, QListWidget, QListWidgetItem, QMainWindow, QMessageBox, QProgressDialog,
                               QPushButton, QScrollArea, QSplitter, QVBoxLayout, QWidget)

from ..chat.attachments import AttachmentError, file_block
from ..chat.export import to_markdown
from ..chat.prompt import chat_prompt_ids, switches_thinking
from ..chat.session import ChatSession, RequestKind
from ..chat.store import ChatStore, StoreError
from ..engine.choices import ProposerKind
from ..engine.errors import ModelError
from ..engine.model_cache import ModelCache
from ..options import LoadOptions
from .acceptance_view import AcceptanceView
from .chat_view import ChatView
from .composer import Composer
from .controls import ControlsPanel, select_quietly
from .model_dialog import AddModelDialog, missing_reason
from .prepared_dialog import PreparedModelsDialog
from .render import RenderOptions, code_blocks, without_thinking
from .theme import RESOURCES, SOURCE_HELP, THEMES
from .worker import GenerationWorker, Loader

if TYPE_CHECKING:
    from ..engine.engine import SpeculativeEngine


@dataclass
class LoadResult:
    ticket: int
    engine: SpeculativeEngine | None = None  # None without an error: superseded by a newer load
    error: str | None = None


log = logging.getLogger("specchat.window")  # what the window does, for `python -m app --verbose`
READING_PROMPT = "Reading the prompt:"  # the status bar while a long prompt is read
READ_AHEAD_AFTER_MS = 400


DEFAULT_SIZE = (1280, 800)
WINDOW_GEOMETRY = "geometry"
SPLITTER_KEYS = ("columns", "right_column")
LAYOUT_KEYS = (WINDOW_GEOMETRY, *SPLITTER_KEYS)  # the settings that place the window


class MainWindow(QMainWindow):
    models_ready = Signal()
    answer_finished = Signal()

    def __init__(self, store: ChatStore, settings: QSettings | None = None, load=None,
                 saved_caches: Path | None = None) -> None:
        """load: models.load_model's signature (its default); saved_caches: where the models'
        caches are kept between runs, so that a chat reopened after a restart is not read again
        (none: not kept). The engine is imported by the models' load, on its thread."""
        super().__init__()
        self.store = store
        self.settings = settings or QSettings("SpecChat", "SpecChat")
        self.models = ModelCache(load, saved_caches, load_marker=store.path.parent / "loading.json")
        self.session = ChatSession(store)
        self.engine: SpeculativeEngine | None = None
        self.editing: int | None = None  # index of the user message being edited in the composer
        self.worker = GenerationWorker()
        self.loader = Loader()
        self.progress: QProgressDialog | None = None
        self.loading = False  # models are being loaded for the current choice
        self._loaded_options: LoadOptions | None = None  # the choice that last loaded: a failed one goes back to it
        self.last_error: str | None = None  # the latest message shown in an error box
        self._send_when_ready = False  # a message sent while they loaded goes as soon as they are there
        # chats deleted before an engine was there (prompt messages, thinking): the models' saved
        # copies of them go once it is
        self._forget_when_loaded: list[tuple[list[dict], bool]] = []
        self._render_timer = QTimer(self, singleShot=True, interval=40)
        self._render_timer.timeout.connect(self._render)
        # The message is read ahead this long after an edit, and then again at most this often
        # while typing goes on (each read-ahead keeps what the one before read that still holds,
        # so a steady typist's long chat is read meanwhile, not only once typing stops)
        self._read_ahead_timer = QTimer(self, singleShot=True, interval=READ_AHEAD_AFTER_MS)
        self._read_ahead_timer.timeout.connect(self.read_ahead)

        self.setWindowTitle("SpecChat")
        self.setWindowIcon(QIcon(str(RESOURCES / "icon.png")))
        self.controls = ControlsPanel()
        self.acceptance = AcceptanceView()
        self.chat_view = ChatView(RenderOptions(THEMES["light"]))
        self.composer = Composer()
        self._build_layout()
        self._build_menus()
        self._restore_settings()
        self.session.new_chat(self.default_system_prompt())
        self._connect()
        self.apply_view_options()
        self.refresh_chat_list()
        self.set_busy(False)
        if store.damaged_copy is not None:
            self.show_error("The chats were damaged", f"The file of chats could not be read ({store.damage}). It "
                            f"was moved aside, unchanged, to {store.damaged_copy}, and SpecChat started with a new one.")
        self._after_a_crashed_load()
        self.load_models()
        QTimer.singleShot(0, self.composer.setFocus)  # type right away; the message waits for the models

    # ---- layout -------------------------------------------------------------------------
    def _build_layout(self) -> None:
        sidebar = QWidget()
        side = QVBoxLayout(sidebar)
        self.search = QLineEdit(placeholderText="Search chats")
        self.chat_list = QListWidget()
        self.chat_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.chat_list.setTextElideMode(Qt.ElideRight)
        buttons = QHBoxLayout()
        self.new_button, self.rename_button, self.delete_button = (
            QPushButton("New"), QPushButton("Rename"), QPushButton("Delete"))
        for button in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(button)
        side.addWidget(self.search)
        side.addWidget(self.chat_list, 1)
        side.addLayout(buttons)

        center = QWidget()
        middle = QVBoxLayout(center)
        legend_row = QHBoxLayout()
        self.legend = QLabel(wordWrap=True)  # on two lines in a narrow window, not cut
        self.colouring = QCheckBox("Colours")
        self.ghosts = QCheckBox("Show rejected drafts")
        legend_row.addWidget(self.legend, 1)
        legend_row.addWidget(self.colouring)
        legend_row.addWidget(self.ghosts)
        middle.addLayout(legend_row)
        middle.addWidget(self.chat_view, 1)
        self.edit_banner = QLabel("Editing your message: Send resends it and the chat continues from there "
                                  "(later messages are removed). Esc cancels.", wordWrap=True)
        self.edit_banner.hide()
        middle.addWidget(self.edit_banner)
        middle.addWidget(self.composer)
        actions = QHBoxLayout()
        self.compare_button = QPushButton("Compare")
        self.compare_button.setToolTip("Rerun the last prompt with speculation off (same seed and settings)")
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Another answer to the last question with the current settings (Ctrl+R);\n"
                                          "the earlier answers stay as versions to flip between")
        self.continue_button = QPushButton("Continue")
        self.continue_button.setToolTip("Go on with the last answer where it stopped (a length limit, Stop, a closed app),\n"
                                        "with the current settings and another max new tokens (Ctrl+Shift+Enter)")
        self.stop_button = QPushButton("Stop")
        self.send_button = QPushButton("Send", objectName="primary")
        actions.addStretch(1)
        for button in (self.continue_button, self.regenerate_button, self.compare_button, self.stop_button,
                       self.send_button):
            actions.addWidget(button)
        middle.addLayout(actions)

        # The acceptance view stays in sight while an answer streams (scrolling when the window is
        # too short for it, rather than squeezing its charts onto their titles); the controls sit
        # below it as tabs of fixed height (each tab scrolls on its own when the window is very short).
        right = QSplitter(Qt.Vertical)
        acceptance = QScrollArea(widgetResizable=True, frameShape=QFrame.NoFrame)
        acceptance.setWidget(self.acceptance)
        right.addWidget(acceptance)
        right.addWidget(self.controls)
        right.setStretchFactor(0, 1)
        right.setChildrenCollapsible(False)
        right.setMinimumWidth(320)

        splitter = QSplitter()
        for widget in (sidebar, center, right):
            splitter.addWidget(widget)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([200, 700, 380])
        self.setCentralWidget(splitter)
        screen = self.screen().availableGeometry()  # a small laptop screen gets a window that fits it
        self.resize(min(DEFAULT_SIZE[0], screen.width()), min(DEFAULT_SIZE[1], screen.height()))
        self.splitters = dict(zip(SPLITTER_KEYS, (splitter, right)))  # their sizes are settings

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.new_action = file_menu.addAction("New chat", QKeySequence.New, self.new_chat)
        file_menu.addAction("Insert a text file into the message...", QKeySequence.Open, self.choose_files)
        file_menu.addAction("Export chat as Markdown...", QKeySequence("Ctrl+E"), self.export_markdown)
        file_menu.addAction("Default system prompt...", self.edit_default_system_prompt)
        file_menu.addAction("Prepared models on disk...", self.show_prepared_models)
        file_menu.addSeparator()
        file_menu.addAction("Quit", QKeySequence.Quit, self.close)
        view_menu = self.menuBar().addMenu("&View")
        self.dark_action = QAction("Dark theme", self, checkable=True)
        view_menu.addAction(self.dark_action)
        view_menu.addSeparator()
        self.text_size = 0  # points added to the chat's and the message box's text (a setting)
        larger = view_menu.addAction("Larger text", lambda: self.set_text_size(self.text_size + 1))
        larger.setShortcuts([QKeySequence.ZoomIn, QKeySequence("Ctrl+=")])  # Ctrl++ wants Shift on most layouts
        view_menu.addAction("Smaller text", QKeySequence.ZoomOut, lambda: self.set_text_size(self.text_size - 1))
        view_menu.addAction("Normal text size", QKeySequence("Ctrl+0"), lambda: self.set_text_size(0))
        chat_menu = self.menuBar().addMenu("&Chat")
        chat_menu.addAction("Stop", QKeySequence("Esc"), self.stop)
        chat_menu.addAction("Regenerate the last answer", QKeySequence("Ctrl+R"), self.regenerate)
        chat_menu.addAction("Continue the last answer", QKeySequence("Ctrl+Shift+Return"), self.continue_answer)
        chat_menu.addAction("Answer the unanswered question", QKeySequence("Ctrl+Shift+R"), self.answer_pending)
        chat_menu.addAction("Edit your last message", QKeySequence("Ctrl+Shift+E"), self.edit_last)
        chat_menu.addAction("Previous version of the last answer", QKeySequence("Alt+Left"), lambda: self.flip_version(-1))
        chat_menu.addAction("Next version of the last answer", QKeySequence("Alt+Right"), lambda: self.flip_version(1))
        chat_menu.addSeparator()
        chat_menu.addAction("Copy the last answer", QKeySequence("Ctrl+Shift+C"), self.copy_last_answer)
        chat_menu.addAction("Copy the last code block", QKeySequence("Ctrl+Shift+K"), self.copy_last_code)
        chat_menu.addSeparator()
        chat_menu.addAction("Compare with speculation off", QKeySequence("Ctrl+K"), self.compare)
        chat_menu.addAction("System prompt for this chat...", QKeySequence("Ctrl+Shift+P"), self.edit_system_prompt)
        chat_menu.addSeparator()
        self.read_ahead_action = QAction("Read the message while it is typed", self, checkable=True, checked=True)
        self.read_ahead_action.setToolTip("The models read your message as you type it, so that its answer "
                                          "starts as soon as you send it (a pasted document too)")
        chat_menu.addAction(self.read_ahead_action)

    def _connect(self) -> None:
        self.composer.send_requested.connect(self.send)
        self.composer.focused.connect(lambda: log.info("the message box has the keyboard focus"))
        self.statusBar().messageChanged.connect(lambda text: text and log.info("status: %s", text))
        self.chat_view.action_requested.connect(self.on_message_action)
        self.composer.stop_requested.connect(self.stop)
        self.composer.files_dropped.connect(self.insert_files)
        self.composer.textChanged.connect(self._read_ahead_soon)
        self.send_button.clicked.connect(lambda: self.send(self.composer.toPlainText().strip()))
        self.stop_button.clicked.connect(self.stop)
        self.compare_button.clicked.connect(self.compare)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.continue_button.clicked.connect(self.continue_answer)
        self.colouring.toggled.connect(self.apply_view_options)
        self.ghosts.toggled.connect(self.apply_view_options)
        self.dark_action.toggled.connect(self.apply_view_options)
        self.session.thinking = self.controls.thinking.isChecked()
        self.controls.thinking.toggled.connect(lambda on: setattr(self.session, "thinking", on))
        self.controls.models_changed.connect(self.load_models)
        self.controls.add_model_requested.connect(self.add_model)
        self.worker.step.connect(self._on_step)
        self.worker.finished.connect(self._on_generation_finished)
        self.worker.failed.connect(lambda message: self.show_error("Generation failed", message))
        self.loader.progress.connect(self._on_load_progress)
        self.loader.loaded.connect(self._on_loaded)
        self.new_button.clicked.connect(self.new_chat)
        self.rename_button.clicked.connect(self.rename_chat)
        self.delete_button.clicked.connect(self.delete_chat)
        self.search.textChanged.connect(self.refresh_chat_list)
        self.chat_list.itemClicked.connect(lambda item: self.open_chat(item.data(Qt.UserRole)))

    # ---- settings and appearance ------------------------------------------------------------
    def _restore_settings(self) -> None:
        s, c = self.settings, self.controls
        if s.value(WINDOW_GEOMETRY) is not None:  # where the user left the window and its columns
            self.restoreGeometry(s.value(WINDOW_GEOMETRY))
        for key, splitter in self.splitters.items():
            if s.value(key) is not None:
                splitter.restoreState(s.value(key))
        for source in s.value("extra_models", [], list) or []:  # a file gone since is marked, not dropped
            c.add_source(Path(source).name or source, source, missing=missing_reason(source))
        # Unset keys keep the controls' own values, which are the shared defaults; one model load
        # after all of them, not one per picker.
        for combo, key in c.load_pickers():
            select_quietly(combo, s.value(key, combo.currentData()))
        c.speculative.setChecked(s.value("speculative", c.speculative.isChecked(), bool))
        c.k.setValue(s.value("k", c.k.value(), int))
        c.adaptive.setChecked(s.value("adaptive", c.adaptive.isChecked(), bool))
        c.lookup.setChecked(s.value("lookup", c.lookup.isChecked(), bool))
        proposer = ProposerKind(s.value("proposer", ProposerKind(c.proposer.currentData()).value))
        c.proposer.setCurrentIndex(max(c.proposer.findData(proposer), 0))
        c.temperature.setValue(s.value("temperature", c.temperature.value(), float))
        c.top_k.setValue(s.value("top_k", c.top_k.value(), int))
        c.top_p.setValue(s.value("top_p", c.top_p.value(), float))
        c.min_p.setValue(s.value("min_p", c.min_p.value(), float))
        c.repeat_penalty.setValue(s.value("repeat_penalty", c.repeat_penalty.value(), float))
        c.max_new_tokens.setValue(s.value("max_new_tokens", c.max_new_tokens.value(), int))
        c.seed.setValue(s.value("seed", c.seed.value(), int))
        c.thinking.setChecked(s.value("thinking", True, bool))
        self.colouring.setChecked(s.value("colouring", True, bool))
        self.ghosts.setChecked(s.value("ghosts", False, bool))
        self.dark_action.setChecked(s.value("theme", "light") == "dark")
        self.read_ahead_action.setChecked(s.value("read_ahead", True, bool))
        self.set_text_size(s.value("text_size", 0, int))

    def save_settings(self) -> None:
        s, c = self.settings, self.controls
        options = c.generation_options()
        for key, value in [*((key, combo.currentData()) for combo, key in c.load_pickers()),
                           ("speculative", options.speculative), ("k", options.k), ("adaptive", options.adaptive),
                           ("lookup", c.lookup.isChecked()),
                           ("proposer", options.proposer.value), ("temperature", options.sampling.temperature),
                           ("top_k", options.sampling.top_k), ("top_p", options.sampling.top_p),
                           ("min_p", options.sampling.min_p), ("repeat_penalty", options.sampling.repeat_penalty),
                           ("max_new_tokens", options.max_new_tokens),
                           ("seed", options.seed), ("thinking", c.thinking.isChecked()),
                           ("colouring", self.colouring.isChecked()),
                           ("ghosts", self.ghosts.isChecked()), ("theme", self.theme.name),
                           ("read_ahead", self.read_ahead_action.isChecked()), ("text_size", self.text_size),
                           (WINDOW_GEOMETRY, self.saveGeometry()),
                           *((key, splitter.saveState()) for key, splitter in self.splitters.items())]:
            s.setValue(key, value)
        s.sync()

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
        app = QApplication.instance()
        if app is not None:
            app.setStyleSheet(theme.stylesheet())
        self.chat_view.set_options(RenderOptions(theme, self.colouring.isChecked(), self.ghosts.isChecked()))
        self.acceptance.set_colours(theme.accepted, theme.corrected)
        swatches = "".join(
            f'<span style="color:{theme.colour(source)};{"text-decoration:underline;" if source == "corrected" else ""}'
            f'{"font-weight:600;" if source == "bonus" else ""}">&#9632;&nbsp;{source}</span>&nbsp;&nbsp; '
            for source in SOURCE_HELP)
        self.legend.setText(swatches)
        self.legend.setToolTip("<br>".join(f"<b>{k}</b>: {v}" for k, v in SOURCE_HELP.items()))

    # ---- models ---------------------------------------------------------------------------
    def load_models(self) -> None:
        chosen = self.controls.load_options()
        ticket = self.models.request()  # any load still running is now stale
        self.worker.stop_reading_ahead()  # for models about to go
        # their caches are saved on the loader's thread (megabytes written), for the next time they run
        leaving = self.engine if not self.session.busy else None
        self.engine = None
        self.loading = True
        self.set_busy(self.session.busy)
        self.statusBar().showMessage(f"Loading models: {chosen.target} + {chosen.draft}...")
        if self.progress is None:
            self.progress = QProgressDialog("Preparing models...", None, 0, 0, self)
            self.progress.setWindowTitle("SpecChat: preparing models")
            self.progress.setWindowModality(Qt.NonModal)
            self.progress.setMinimumDuration(800)

        def job(report) -> LoadResult:
            if leaving is not None:
                leaving.save_caches()  # waits for the read-ahead told to stop above
            try:
                return LoadResult(ticket, self.models.engine(ticket, chosen, report))
            except ModelError as error:  # a missing or corrupt model file
                return LoadResult(ticket, error=str(error))
            except Exception as error:  # anything else: said in the window, traceback in the log
                traceback.print_exc()
                return LoadResult(ticket, error=f"{type(error).__name__}: {error}")

        self.loader.run(job)

    def _after_a_crashed_load(self) -> None:
        """The default pair, and why, when the last run ended while it loaded other models: loading
        them again could end this one the same way."""
        crashed = self.models.crashed_load
        if crashed is None:
            return
        defaults = LoadOptions()
        if (crashed["target"], crashed["draft"]) == (defaults.target, defaults.draft):
            pair, then = "the default pair", "It is loaded again now."
        else:
            pair, then = f"{crashed['target']} with draft {crashed['draft']}", \
                "This run starts with the default pair; pick those models again to retry."
            self.controls.show_load_options(defaults)
        self.show_error("SpecChat closed while loading models", f"The last run ended while it loaded {pair} (a crash, "
                        f"or the system ending it for want of memory). {then}")

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        if self.progress is None or self.engine is not None:
            return
        self.progress.setLabelText(stage)
        self.progress.setMaximum(0 if fraction < 0 else 100)
        self.progress.setValue(0 if fraction < 0 else int(fraction * 100))
        self.statusBar().showMessage(stage)

    def _on_loaded(self, result: LoadResult) -> None:
        if not self.models.is_current(result.ticket):
            return  # the user picked other models meanwhile; their load reports instead
        self.loading = False
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        if self.models.device_text:
            self.controls.device.setText(self.models.device_text)
        if result.engine is None:
            self._send_when_ready = False  # the message stays in the box
            self.set_busy(self.session.busy)
            self.statusBar().showMessage("Models not loaded")
            # Back to the pair that last loaded (its prepared copies load in seconds), or at the start
            # to the default pair (a saved choice whose file is gone), rather than leaving none.
            fallback = self._loaded_options or LoadOptions()
            if self.controls.load_options() != fallback:
                self.controls.show_load_options(fallback)
                self.load_models()
            self.show_error("Cannot use these models", result.error or "unknown error")
            return
        previous, self._loaded_options = self._loaded_options, self.controls.load_options()
        if previous is None or previous.target != self._loaded_options.target:
            self.controls.clear_draft_marks()  # they said which drafts the last target's vocabulary refused
        self.engine = result.engine
        target, draft = self.engine.target, self.engine.draft
        self.controls.thinking.setEnabled(switches_thinking(target.tokenizer))
        self._forget_deleted_chats()
        self._show_memory()
        with_draft = f"with draft {draft.name} ({draft.precision})" if draft else "no draft model (prompt lookup)"
        self.statusBar().showMessage(f"Ready: {target.name} ({target.precision}), {with_draft}", 5000)
        if self.engine.draft_refused:  # a target of another family than the draft: it runs alone
            self.controls.mark_draft_incompatible(self._loaded_options.draft, self.engine.draft_refused)
            reason = self.engine.draft_refused.rstrip(".")
            self.show_error("The draft cannot draft for this target",
                            f"{reason}. Meanwhile {target.name} runs alone, speculating by prompt lookup (copying "
                            "from the conversation).")
        self.set_busy(self.session.busy)
        if self._send_when_ready:
            self._send_when_ready = False
            self.send(self.composer.toPlainText().strip())
        else:
            self._read_ahead_timer.start()  # a message typed while the models loaded
        log.info("models ready")
        self.models_ready.emit()

    def add_model(self) -> None:
        dialog = AddModelDialog(self, self.settings.value("model_folder", "", str))
        if dialog.exec() != AddModelDialog.Accepted:
            return
        source = dialog.chosen()
        if Path(source).expanduser().exists():
            self.settings.setValue("model_folder", str(Path(source).expanduser().resolve().parent))
        self.add_model_source(source)

    def add_model_source(self, source: str) -> None:
        """Adds a model to both pickers; flags it as a draft when its vocabulary differs, and in both
        when its tokenizer cannot be read."""
        self.controls.add_source(Path(source).name or source, source)
        extra = self.settings.value("extra_models", [], list) or []
        if source not in extra:
            self.settings.setValue("extra_models", [*extra, source])
        if self.engine is None:
            return
        target = self.engine.target

        def job(report) -> tuple[Callable[[str, str], None], str] | None:
            from ..engine.models import load_tokenizer, vocabulary_mismatch

            try:
                tokenizer = load_tokenizer(source)
            except ModelError as error:
                return self.controls.mark_unreadable, str(error)
            mismatch = vocabulary_mismatch(tokenizer, target.tokenizer, source, target.name)
            return (self.controls.mark_draft_incompatible, mismatch) if mismatch else None

        checker = Loader(self)
        checker.loaded.connect(lambda found: found and found[0](source, found[1]))
        checker.run(job)

    def show_prepared_models(self) -> PreparedModelsDialog:
        """The copies models' first starts wrote, with Delete for those neither loaded nor loading now
        (modal in use; returned shown for tests)."""
        from ..engine.prepared import noted_precision, noted_source

        drafting = self.engine is None or self.engine.draft is not None  # not a draft of another vocabulary
        used = []
        for options in {self._loaded_options, self.controls.load_options()} - {None}:  # loaded, and loading
            used.append((options.target, options.precision))
            if drafting:
                used.append((options.draft, options.draft_precision))
        dialog = PreparedModelsDialog(self, frozenset((noted_source(s), noted_precision(p)) for s, p in used))
        dialog.open()
        return dialog

    # ---- chats --------------------------------------------------------------------------
    @property
    def conversation(self):
        return self.session.conversation

    def refresh_chat_list(self) -> None:
        self.chat_list.clear()
        try:
            chats = self.store.list_chats(self.search.text())
        except StoreError as error:  # the file damaged or gone from under the app: said, the window goes on
            self.show_error("Could not read the chats", str(error))
            return
        for chat_id, title, _ in chats:
            item = QListWidgetItem(title)
            item.setData(Qt.UserRole, chat_id)
            self.chat_list.addItem(item)
            if chat_id == self.conversation.id:
                item.setSelected(True)

    def new_chat(self) -> None:
        if self.session.busy:
            return
        self.session.new_chat(self.default_system_prompt())
        self.cancel_edit()
        self.chat_view.show_messages([])
        self.refresh_chat_list()
        self.set_busy(False)
        self._read_ahead_timer.start()  # a message already typed goes to this chat now

    def open_chat(self, chat_id: int) -> None:
        if self.session.busy:
            return
        try:
            self.session.open_chat(chat_id)
        except (StoreError, KeyError) as error:  # damaged, or deleted meanwhile
            self.show_error("Could not open the chat", str(error) if isinstance(error, StoreError) else
                            "It is no longer in the file of chats.")
            self.refresh_chat_list()
            return
        self.cancel_edit()
        self.chat_view.show_messages(self.conversation.messages)
        answer = self.session.last_answer()
        if answer is not None:
            self.acceptance.show_stats(answer.stats)
        self.set_busy(False)
        self._read_ahead_timer.start()  # a message already typed goes to this chat now

    def rename_chat(self) -> None:
        if self.conversation.id is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=self.conversation.title)
        if ok and title.strip():
            self.conversation.title = title.strip()
            self._save(lambda: self.store.rename_chat(self.conversation.id, self.conversation.title))
            self.refresh_chat_list()

    def delete_chat(self) -> None:
        if self.conversation.id is None or self.session.busy:
            return
        if QMessageBox.question(self, "Delete chat", f"Delete '{self.conversation.title}'?") != QMessageBox.Yes:
            return
        self._forget_when_loaded.append((self.session.prompt_for(""), self.session.thinking))
        self._forget_deleted_chats()  # the models' copies of it, in memory and on disk
        self._save(lambda: self.store.delete_chat(self.conversation.id))
        self.new_chat()

    def _forget_deleted_chats(self) -> None:
        if self.engine is None or not self._forget_when_loaded:
            return  # nothing to forget, or no models yet to tell which copies were the chat's
        self.worker.stop_reading_ahead(wait_seconds=10)
        # one still in use by a request (forget_conversation timed out) is tried again after it
        self._forget_when_loaded = [
            (prompt, thinking) for prompt, thinking in self._forget_when_loaded
            if not self.engine.forget_conversation(chat_prompt_ids(self.engine.target.tokenizer, prompt, thinking))]

    def export_markdown(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{self.conversation.title}.md", "Markdown (*.md)")
        if path:
            try:
                Path(path).write_text(to_markdown(self.conversation), encoding="utf-8")
            except OSError as error:
                self.show_error("Export failed", f"Could not write {path}: {error}")

    def _save(self, write) -> bool:
        try:
            write()
            return True
        except StoreError as error:
            self.show_error("Could not save", str(error))
            return False

    def _show_save_errors(self) -> None:
        while self.session.errors:
            self.show_error("Could not save", self.session.errors.pop(0))

    # ---- generation -----------------------------------------------------------------------
    def set_busy(self, busy: bool) -> None:
        ready = self.engine is not None
        self.send_button.setEnabled((ready or self.loading) and not busy)  # sent while loading: once they are there
        self.compare_button.setEnabled(ready and not busy and self.session.last_answer() is not None)
        self.regenerate_button.setEnabled(ready and not busy and self.session.can_regenerate())
        self.continue_button.setEnabled(ready and not busy and self.session.can_continue())
        self.stop_button.setEnabled(busy)
        # Chats and models can be changed only between answers.
        for widget in (self.controls.add_model, self.chat_list, self.new_button, self.delete_button, self.controls.target,
                       self.controls.draft, self.controls.precision, self.controls.draft_precision,
                       self.controls.kv_cache):
            widget.setEnabled(not busy)

    def _can_start(self) -> bool:
        if self.session.busy:
            return False
        if self.engine is None:
            self.statusBar().showMessage("The models are still loading; your message stays in the box.", 5000)
            return False
        return True

    def send(self, text: str) -> None:
        if text and self.engine is None and self.loading and not self.session.busy:
            self._send_when_ready = True
            log.info("message of %d characters waits for the models", len(text))
            self.statusBar().showMessage("The models are still loading: your message is sent as soon as they are ready "
                                         "(Esc keeps it here).")
            return
        if not text or not self._can_start():
            return
        log.info("message of %d characters sent", len(text))
        self.composer.clear()
        options = self.controls.generation_options()
        if self.editing is not None:
            index, self.editing = self.editing, None
            self.edit_banner.hide()
            request = self.session.edit(index, text, self.engine, options)
        else:
            request = self.session.ask(text, self.engine, options)
        self.chat_view.show_messages(self.conversation.messages, answer_follows=True)
        self._start(request)
        self.refresh_chat_list()

    def _read_ahead_soon(self) -> None:
        if not self._read_ahead_timer.isActive():  # restarted on every key, it would wait for a pause
            self._read_ahead_timer.start()

    def read_ahead(self) -> None:
        """Lets the models read the message typed so far, as sending it would give it to them."""
        text = self.composer.toPlainText().strip()
        if not text or not self.read_ahead_action.isChecked() or self.engine is None or self.session.busy:
            return
        self.worker.read_ahead(self.engine, self.session.prompt_ids_for(text, self.engine, replacing=self.editing))

    def answer_pending(self) -> None:
        if self._can_start() and self.session.unanswered():
            self._start(self.session.answer(self.engine, self.controls.generation_options()))

    def regenerate(self) -> None:
        """Another answer to the last question with the current settings; earlier ones stay as versions."""
        if self._can_start() and self.session.can_regenerate():
            self._start(self.session.regenerate(self.engine, self.controls.generation_options()))

    def continue_answer(self) -> None:
        """The last answer goes on from where it stopped, growing in place."""
        if self._can_start() and self.session.can_continue():
            self._start(self.session.continue_answer(self.engine, self.controls.generation_options()))

    def edit_message(self, index: int) -> None:
        if self.session.busy or self.conversation.messages[index].role != "user":
            return
        self.editing = index
        self.composer.setPlainText(self.conversation.messages[index].content)
        self.composer.setFocus()
        self.edit_banner.show()

    def edit_last(self) -> None:
        users = [i for i, m in enumerate(self.conversation.messages) if m.role == "user"]
        if users:
            self.edit_message(users[-1])

    def cancel_edit(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.composer.clear()
            self.edit_banner.hide()

    def flip_version(self, step: int) -> None:
        messages = self.conversation.messages
        if messages and messages[-1].versions:
            self.show_version(len(messages) - 1, messages[-1].shown + step)

    def show_version(self, index: int, version: int) -> None:
        self.session.show_version(index, version)
        self.chat_view.show_messages(self.conversation.messages)
        self.acceptance.show_stats(self.conversation.messages[index].stats)
        self.set_busy(self.session.busy)  # the version shown may or may not be one to continue
        self._show_save_errors()

    def copy_last_answer(self) -> None:
        answer = self.session.last_answer()
        if answer is not None:
            self.copy_answer(answer.content)

    def copy_answer(self, content: str) -> None:
        """An answer without a reasoning model's thinking, as the reader wants it elsewhere."""
        answer = without_thinking(content)
        self.copy_text(answer, "answer" if answer == content else "answer (its thinking left out)")

    def copy_last_code(self) -> None:
        answers = [m for m in self.conversation.messages if m.role == "assistant" and code_blocks(m.content)]
        if answers:
            self.copy_text(code_blocks(answers[-1].content)[-1], "code block")

    def copy_text(self, text: str, what: str) -> None:
        QApplication.clipboard().setText(text)
        self.statusBar().showMessage(f"Copied the {what} ({len(text):,} characters)", 3000)

    def on_message_action(self, action: str, index: int, extra: int) -> None:
        """A link in the chat view: copy, copycode, edit, regenerate, continue, version, answer."""
        if index >= len(self.conversation.messages):
            return
        message = self.conversation.messages[index]
        if action == "copy" and message.role == "assistant":
            self.copy_answer(message.content)
        elif action == "copy":
            self.copy_text(message.content, "message")
        elif action == "copycode":
            blocks = code_blocks(message.content)
            if extra < len(blocks):
                self.copy_text(blocks[extra], "code block")
        elif action == "edit":
            self.edit_message(index)
        elif action == "regenerate":
            self.regenerate()
        elif action == "continue":
            self.continue_answer()
        elif action == "version" and not self.session.busy:
            self.show_version(index, extra)
        elif action == "answer":
            self.answer_pending()

    def choose_files(self) -> None:
        names, _ = QFileDialog.getOpenFileNames(self, "Insert text files into the message")
        self.insert_files([Path(name) for name in names])

    def insert_files(self, paths: list[Path]) -> None:
        """Each text file as a code block named after it, at the cursor; a file that is not
        text (or too big, or unreadable) is named in the status bar and nothing of it goes in."""
        refused = []
        for path in paths:
            try:
                block = file_block(path)
            except AttachmentError as error:
                refused.append(str(error))
                continue
            cursor = self.composer.textCursor()
            if cursor.positionInBlock() > 0:
                cursor.insertText("\n")
            cursor.insertText(block)
        self.composer.setFocus()
        if refused:
            self.statusBar().showMessage("; ".join(refused), 10000)

    def edit_system_prompt(self) -> None:
        text, ok = QInputDialog.getMultiLineText(self, "System prompt", "Sent before every message of this chat:",
                                                 self.conversation.system_prompt)
        if ok:
            self.session.set_system_prompt(text.strip())
            self._show_save_errors()

    def edit_default_system_prompt(self) -> None:
        text, ok = QInputDialog.getMultiLineText(self, "Default system prompt", "New chats start with:",
                                                 self.default_system_prompt())
        if ok:
            self.settings.setValue("system_prompt", text.strip())

    def default_system_prompt(self) -> str:
        return self.settings.value("system_prompt", "", str) or ""

    def compare(self) -> None:
        if self.session.busy or self.engine is None:
            return
        request = self.session.compare(self.engine, self.controls.generation_options())
        if request is not None:
            self.statusBar().showMessage("Comparing: the same prompt with speculation off...")
            self._start(request)

    def _start(self, request) -> None:
        self._show_save_errors()
        self.set_busy(True)
        self.worker.start(self.engine, request.prompt_ids, request.options)

    def stop(self) -> None:
        self.cancel_edit()
        if self._send_when_ready:
            self._send_when_ready = False
            self.statusBar().showMessage("Not sent: your message stays in the box.", 5000)
        if self.worker.running:
            self.worker.stop()
            self.statusBar().showMessage("Stopping after this step...", 3000)

    def _on_step(self, step) -> None:
        if step.stats.prompt_read:  # a long prompt is still being read
            total = self.session.builder.stats.prompt_tokens if self.session.builder else 0
            self.statusBar().showMessage(f"{READING_PROMPT} {step.stats.prompt_read:,} of {total:,} tokens...")
        elif self.statusBar().currentMessage().startswith(READING_PROMPT):
            self.statusBar().clearMessage()
        self.session.add_step(step)
        if not self._render_timer.isActive():
            self._render_timer.start()

    def _render(self) -> None:
        if self.session.builder is None:
            return
        self.acceptance.show_stats(self.session.builder.stats)
        if self.session.request.kind is not RequestKind.COMPARE:
            visible = self.session.visible_messages()
            self.chat_view.stream(visible[:-1], visible[-1])

    def _on_generation_finished(self) -> None:
        self._render_timer.stop()
        comparing = self.session.request is not None and self.session.request.kind is RequestKind.COMPARE
        changed = self.session.finish()
        if changed is not None:
            self.acceptance.show_stats(changed.stats)  # a comparison included, beside the run it compared
            if comparing:
                self.statusBar().showMessage("Comparison done", 5000)
        self.chat_view.finish(self.conversation.messages)
        self.refresh_chat_list()
        self._show_save_errors()
        self._show_memory()
        self.set_busy(False)
        self._forget_deleted_chats()  # one the answer's request held
        self._read_ahead_timer.start()  # what was typed meanwhile
        log.info("answer finished")
        self.answer_finished.emit()

    def _show_memory(self) -> None:
        """The models' weights, and what their caches (conversations kept included) take now."""
        if self.engine is None:
            return
        target, draft, caches = self.engine.target, self.engine.draft, self.engine.cache_bytes()
        self.acceptance.show_memory(
            f"target {target.memory_bytes / 2**30:.2f} GiB ({target.precision}), "
            + (f"draft {draft.memory_bytes / 2**30:.2f} GiB ({draft.precision})" if draft else "no draft model")
            + (f", caches {caches / 2**20:,.0f} MiB" if caches else "")
            + (f" ({str(self.engine.kv_cache).removeprefix('torch.')})" if caches and self.engine.kv_cache else ""),
            (f"The draft's weights add {draft.memory_bytes / target.memory_bytes:.0%} to the target's. " if draft else "")
            + "The caches hold the keys and values of this conversation, and of earlier ones kept so that going back "
            "to them reads only what is new.")

    def show_error(self, title: str, message: str) -> None:
        self.statusBar().showMessage(f"{title}: {message}", 10000)
        log.warning("error shown: %s: %s", title, message)
        box = QMessageBox(QMessageBox.Warning, title, message, QMessageBox.Ok, self)
        box.setModal(False)
        box.show()
        self.last_error = message

    # ---- closing ---------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        """Stop generation at the next step and keep what was generated so far."""
        self._read_ahead_timer.stop()
        self.models.closing()
        self.worker.stop_reading_ahead(wait_seconds=10)  # not left running in the model's memory at exit
        if self.worker.running:
            self.worker.stop()
            self.worker.wait(30)
        self.session.interrupt()
        if self.engine is not None:
            self._forget_deleted_chats()  # before the caches are saved: a deleted chat's must not be
            self.engine.save_caches()  # a chat reopened in the next run is not read again
        self.save_settings()
        super().closeEvent(event)
