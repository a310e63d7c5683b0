"""What the user does to the messages already in the chat: the links under each (copy, copy a
code block, edit, regenerate, continue, flip versions, answer), their menu shortcuts, and the files
inserted into the message box."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from PySide6.QtWidgets import QApplication, QFileDialog, QStatusBar, QWidget

from ..chat.attachments import AttachmentError, document_block
from ..chat.controller import ChatController
from .acceptance_view import AcceptanceView
from .chat_view import ChatView
from .composer import Composer
from .markdown import code_blocks
from .thinking import without_thinking


class MessagesWindow(Protocol):
    """What the message actions use of the window they act in (a QMainWindow, also their dialogs' parent)."""

    controller: ChatController
    composer: Composer
    edit_banner: QWidget
    chat_view: ChatView
    acceptance: AcceptanceView

    def statusBar(self) -> QStatusBar: ...
    def set_busy(self, busy: bool) -> None: ...
    def chat_changed(self) -> None: ...
    def fork(self, index: int) -> None: ...
    def regenerate(self) -> None: ...
    def continue_answer(self) -> None: ...
    def answer_pending(self) -> None: ...


class MessageActions:
    def __init__(self, window: MessagesWindow) -> None:
        self.window = window
        self.editing: int | None = None  # index of the user message being edited in the composer

    @property
    def messages(self):
        return self.window.controller.conversation.messages

    def on_message_action(self, action: str, index: int, extra: int) -> None:
        """A link in the chat view: copy, copycode, edit, regenerate, continue, version, fork, answer."""
        if index >= len(self.messages):
            return
        message, window = self.messages[index], self.window
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
        elif action == "version" and not window.controller.session.busy:
            self.show_version(index, extra)
        elif action == "fork":
            window.fork(index)
        elif action in ("regenerate", "continue", "answer"):
            {"regenerate": window.regenerate, "continue": window.continue_answer, "answer": window.answer_pending}[action]()

    def edit_message(self, index: int) -> None:
        if self.window.controller.session.busy or self.messages[index].role != "user":
            return
        self.editing = index
        self.window.composer.setPlainText(self.messages[index].content)
        self.window.composer.setFocus()
        self.window.edit_banner.show()

    def edit_last(self) -> None:
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        if users:
            self.edit_message(users[-1])

    def cancel_edit(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.window.composer.clear()
            self.window.edit_banner.hide()

    def take_edit(self) -> int | None:
        """The message being edited, which the message sent now replaces (the edit ends)."""
        editing, self.editing = self.editing, None
        self.window.edit_banner.hide()
        return editing

    def flip_version(self, step: int) -> None:
        if self.messages and self.messages[-1].versions:
            self.show_version(len(self.messages) - 1, self.messages[-1].shown + step)

    def show_version(self, index: int, version: int) -> None:
        window = self.window
        if window.controller.show_version(index, version):  # an earlier answer: a fork shows it
            window.chat_changed()
            window.statusBar().showMessage(f"Version {version + 1} of that answer opened in a fork, named after the "
                                           "chat: the turns after it were answered to the other version.", 8000)
            return
        window.chat_view.show_messages(self.messages)
        window.acceptance.show_stats(self.messages[index].stats)
        window.set_busy(window.controller.session.busy)  # the version shown may or may not be one to continue

    def copy_last_answer(self) -> None:
        answer = self.window.controller.session.last_answer()
        if answer is not None:
            self.copy_answer(answer.content)

    def copy_answer(self, content: str) -> None:
        """An answer without a reasoning model's thinking, as the reader wants it elsewhere."""
        answer = without_thinking(content)
        self.copy_text(answer, "answer" if answer == content else "answer (its thinking left out)")

    def copy_last_code(self) -> None:
        answers = [m for m in self.messages if m.role == "assistant" and code_blocks(m.content)]
        if answers:
            self.copy_text(code_blocks(answers[-1].content)[-1], "code block")

    def copy_text(self, text: str, what: str) -> None:
        QApplication.clipboard().setText(text)
        self.window.statusBar().showMessage(f"Copied the {what} ({len(text):,} characters)", 3000)

    def choose_files(self) -> None:
        names, _ = QFileDialog.getOpenFileNames(self.window, "Attach files to the message", "",
                                                "Text and documents (*.txt *.md *.pdf *.docx *.html *.htm *.*)")
        self.insert_files([Path(name) for name in names])

    def insert_files(self, paths: list[Path]) -> None:
        """Each text file or document (PDF, DOCX, HTML) as a block of its text named after it, at
        the cursor; one that has no text, is unreadable or does not fit the context room left is
        named in the status bar and nothing of it goes in."""
        refused, added = [], []
        composer = self.window.composer
        for path in paths:
            try:
                block, holds = document_block(path)
            except AttachmentError as error:
                refused.append(str(error))
                continue
            room = self.window.controller.context_room(composer.toPlainText(), block)
            if room is not None and room[0] > room[1]:
                tokens, left, context = room
                refused.append(f"{path.name} is {tokens:,} tokens, and the context has room for {max(left, 0):,} more "
                               f"(of {context:,}): set a longer context length (Models tab) or attach a part of it")
                continue
            cursor = composer.textCursor()
            if cursor.positionInBlock() > 0:
                cursor.insertText("\n")
            cursor.insertText(block)
            added.append(f"{path.name} ({holds}{f', {room[0]:,} tokens' if room else ''})")
        composer.setFocus()
        if refused or added:
            self.window.statusBar().showMessage("; ".join(refused + [f"Attached {', '.join(added)}"] * bool(added)), 15000)
