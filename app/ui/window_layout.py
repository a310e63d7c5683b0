"""The main window's widgets and their places, built onto the window as Qt Designer's setupUi
does: the chats on the left; the conversation, its legend, the message box and the actions in the
middle; the acceptance view above the controls on the right."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QFrame, QHBoxLayout, QLabel, QLineEdit, QListWidget, QMainWindow, QPushButton,
                               QScrollArea, QSplitter, QVBoxLayout, QWidget)

from .acceptance_view import AcceptanceView
from .chat_view import ChatView
from .chat_list import ChatListDelegate
from .composer import Composer
from .controls import ControlsPanel
from .token_html import RenderOptions
from .settings import SPLITTER_KEYS
from .theme import THEMES

DEFAULT_SIZE = (1280, 800)
CONVERSATION_HELP = ("The chat's messages; each answer's tokens are coloured by where they came from: accepted, "
                     "corrected, bonus or plain. Arrow keys move a caret; the token at it is described.")


def build_layout(window: QMainWindow) -> None:
    """Each view becomes an attribute of `window` (window.chat_view, window.controls, ...)."""
    window.controls = ControlsPanel()
    window.acceptance = AcceptanceView()
    window.chat_view = ChatView(RenderOptions(THEMES["light"]))
    window.composer = Composer()

    sidebar = QWidget()
    side = QVBoxLayout(sidebar)
    window.search = QLineEdit(placeholderText="Search chats")
    window.chat_list = QListWidget()
    window.chat_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    window.chat_list.setTextElideMode(Qt.ElideRight)
    window.chat_list.setItemDelegate(ChatListDelegate(window.chat_list))
    buttons = QHBoxLayout()
    window.new_button, window.rename_button, window.delete_button = (
        QPushButton("New"), QPushButton("Rename"), QPushButton("Delete"))
    for button in (window.new_button, window.rename_button, window.delete_button):
        buttons.addWidget(button)
    side.addWidget(window.search)
    side.addWidget(window.chat_list, 1)
    # names a screen reader says (the pickers and fields of the forms take theirs from their labels)
    for widget, name, description in (
            (window.search, "Search chats", "Shows the chats whose title or messages hold the words"),
            (window.chat_list, "Chats", "The saved chats, newest first"),
            (window.chat_view, "Conversation", CONVERSATION_HELP),
            (window.composer, "Message", "Enter sends, Shift+Enter starts a new line, Esc stops the answer")):
        widget.setAccessibleName(name)
        widget.setAccessibleDescription(description)
    side.addLayout(buttons)

    center = QWidget()
    middle = QVBoxLayout(center)
    legend_row = QHBoxLayout()
    window.legend = QLabel(wordWrap=True)  # on two lines in a narrow window, not cut
    window.colouring = QCheckBox("Colours", checked=True)
    window.ghosts = QCheckBox("Show rejected drafts")
    legend_row.addWidget(window.legend, 1)
    legend_row.addWidget(window.colouring)
    legend_row.addWidget(window.ghosts)
    middle.addLayout(legend_row)
    middle.addWidget(window.chat_view, 1)
    # the token at the keyboard caret in words (what hovering shows), for keyboard and screen-reader users
    window.token_details = QLabel(wordWrap=True)
    window.token_details.setAccessibleName("Token details")
    window.token_details.hide()
    middle.addWidget(window.token_details)
    window.edit_banner = QLabel("Editing your message: Send resends it and the chat continues from there "
                                "(later messages are removed). Esc cancels.", wordWrap=True)
    window.edit_banner.hide()
    middle.addWidget(window.edit_banner)
    middle.addWidget(window.composer)
    actions = QHBoxLayout()
    window.compare_button = QPushButton("Compare")
    window.compare_button.setToolTip("Rerun the last prompt with speculation off (same seed and settings)")
    window.regenerate_button = QPushButton("Regenerate")
    window.regenerate_button.setToolTip("Another answer to the last question with the current settings (Ctrl+R);\n"
                                        "the earlier answers stay as versions to flip between")
    window.continue_button = QPushButton("Continue")
    window.continue_button.setToolTip("Go on with the last answer where it stopped (a length limit, Stop, a closed app),\n"
                                      "with the current settings and another max new tokens (Ctrl+Shift+Enter)")
    window.stop_button = QPushButton("Stop")
    window.send_button = QPushButton("Send", objectName="primary")
    actions.addStretch(1)
    for button in (window.continue_button, window.regenerate_button, window.compare_button, window.stop_button,
                   window.send_button):
        actions.addWidget(button)
    middle.addLayout(actions)

    # The acceptance view stays in sight while an answer streams (scrolling when the window is
    # too short for it, rather than squeezing its charts onto their titles); the controls sit
    # below it as tabs of fixed height (each tab scrolls on its own when the window is very short).
    right = QSplitter(Qt.Vertical)
    acceptance = QScrollArea(widgetResizable=True, frameShape=QFrame.NoFrame)
    acceptance.setWidget(window.acceptance)
    right.addWidget(acceptance)
    right.addWidget(window.controls)
    right.setStretchFactor(0, 1)
    right.setChildrenCollapsible(False)
    right.setMinimumWidth(320)

    splitter = QSplitter()
    for widget in (sidebar, center, right):
        splitter.addWidget(widget)
    splitter.setStretchFactor(1, 1)
    splitter.setSizes([200, 700, 380])
    window.setCentralWidget(splitter)
    screen = window.screen().availableGeometry()  # a small laptop screen gets a window that fits it
    window.resize(min(DEFAULT_SIZE[0], screen.width()), min(DEFAULT_SIZE[1], screen.height()))
    window.splitters = dict(zip(SPLITTER_KEYS, (splitter, right)))  # their sizes are settings
