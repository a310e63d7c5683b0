"""The conversation view: Markdown answers with every token coloured by provenance, a tooltip
per token, action links (copy, edit, regenerate, versions), and streaming whose cost per update
does not grow with the answer or the chat.

While an answer streams, only its end is rewritten: the Markdown blocks that are complete (up to
the last blank line outside a code fence) are rendered once and stay in the document; the open
block after them is re-rendered on each update. Everything before the answer is left alone, so
a selection there survives and copying works while the answer grows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from html import escape

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QMouseEvent, QTextCursor, QTextDocument
from PySide6.QtWidgets import QTextBrowser, QToolTip

from ..chat.conversation import Message, TokenRecord
from .links import parse_action, parse_href
from .markdown import code_blocks
from .message_html import body_start, message_header_html, message_html, unanswered_html
from .token_html import RenderOptions, answer_part_html
from .theme import SOURCE_HELP


def token_details(token: TokenRecord) -> list[str]:
    """Where a token came from, line by line: the tooltip's, and the keyboard's details line."""
    lines = [f"{token.source.value}: {SOURCE_HELP[token.source.value]}", f"p_target {token.p_target:.3f}"]
    if token.p_draft is not None:
        lines.append(f"p_draft {token.p_draft:.3f}")
    if token.replaced is not None:
        lines.append(f"replaced draft token {token.replaced!r}" + (", copied from earlier text" if token.copied else ""))
    elif token.copied:
        lines.append("copied from earlier text (no draft model pass)")
    return lines


def token_tooltip(token: TokenRecord) -> str:
    lines = token_details(token)
    source, help_text = lines[0].split(": ", 1)
    text = partial(escape, quote=False)
    return "<br>".join([f"<b>{text(source)}</b>: {text(help_text)}", *map(text, lines[1:])])


@dataclass
class _Stream:
    """Where the streaming answer's open block starts in the document, and what is closed."""

    message_index: int
    before: list[int]  # ids of the messages shown above the answer
    header_start: int  # document position where the answer's header begins
    tail_start: int  # document position after the closed blocks
    closed: int = 0  # characters of the answer rendered for good
    code_blocks: int = 0  # fenced blocks among them (numbers the copy links)
    scanned: int = 0  # characters scanned for block boundaries
    in_fence: bool = False
    boundary: int = 0  # end of the last blank line outside a fence
    owners: list[int] = field(default_factory=list)  # token index of each character
    tokens: int = 0  # tokens whose characters are in owners


class ChatView(QTextBrowser):
    action_requested = Signal(str, int, int)  # action, message index, extra (a code block, a version)
    token_focused = Signal(str)  # the details of the token at the keyboard caret ("" on none)

    def __init__(self, options: RenderOptions) -> None:
        super().__init__()
        self.options = options
        self.messages: list[Message] = []
        self._stream: _Stream | None = None
        self._shown: tuple[list[int], bool] = ([], False)  # what show_messages last rendered
        self._html_cache: dict[tuple, str] = {}
        self.setOpenLinks(False)
        self.setMouseTracking(True)
        self.viewport().setMouseTracking(True)
        self.setPlaceholderText("Ask anything. Tokens are coloured by where they came from.")
        self.anchorClicked.connect(self._on_anchor)
        # A keyboard caret through the answers (click in the view, or Tab to it; arrows move it):
        # the token at it is told in words, as hovering shows it to a mouse
        self.setTextInteractionFlags(self.textInteractionFlags() | Qt.TextSelectableByKeyboard)
        self.cursorPositionChanged.connect(self._caret_moved)
        # The scroll position set to keep the end in view, while the user leaves it there. Qt lays
        # a long document out in time slices (more of them while the engine keeps the cores busy),
        # so the scroll range grows after a change returns: the view follows it there too.
        self._pinned: int | None = None
        self._restoring: float | None = None  # a position being restored (restore_position)
        self.verticalScrollBar().rangeChanged.connect(self._follow_growth)
        self.verticalScrollBar().actionTriggered.connect(lambda action: self._stop_restoring())  # the user scrolls

    # ---- whole conversation -------------------------------------------------------------------
    def show_messages(self, messages: list[Message], answer_follows: bool = False) -> None:
        """Render finished `messages`; stays at the bottom if it was there. A last question gets
        an "Answer it" link unless `answer_follows`."""
        self._stream = None
        self.messages = list(messages)
        self._shown = ([id(m) for m in messages], answer_follows)
        parts = [body_start(self.options)]
        parts += [self._message_html(i, m, last=i == len(messages) - 1) for i, m in enumerate(messages)]
        if messages and messages[-1].role == "user" and not answer_follows:
            parts.append(unanswered_html(len(messages) - 1, self.options))
        self._keep_bottom(lambda: self.setHtml("".join(parts) + "</body>"))

    def _message_html(self, index: int, message: Message, last: bool) -> str:
        key = (id(message), len(message.versions), message.shown, message.content, message.stats, index, last,
               self.options)
        if key not in self._html_cache:
            if len(self._html_cache) > 1000:
                self._html_cache.clear()
            self._html_cache[key] = message_html(index, message, self.options, last)
        return self._html_cache[key]

    def set_options(self, options: RenderOptions) -> None:
        self.options = options
        self.show_messages(self.messages)

    # ---- streaming ------------------------------------------------------------------------------
    def stream(self, before: list[Message], answer: Message) -> None:
        """Show `answer` growing after the finished messages `before` (called on each update)."""
        if self._stream is None or self._stream.before != [id(m) for m in before]:
            self._begin_stream(before, answer)
        stream = self._stream
        self.messages[-1] = answer
        text = answer.content
        stream.owners += [i for i in range(stream.tokens, len(answer.tokens)) for _ in answer.tokens[i].text]
        stream.tokens = len(answer.tokens)
        self._scan(stream, text)

        def update() -> None:
            cursor = QTextCursor(self.document())
            cursor.setPosition(stream.tail_start)
            cursor.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
            cursor.removeSelectedText()
            if stream.boundary > stream.closed:  # blocks completed since the last update: render them for good
                chunk = text[stream.closed : stream.boundary]
                cursor.insertHtml(self._part_html(stream, answer, stream.closed, stream.boundary))
                stream.code_blocks += len(code_blocks(chunk))
                stream.closed = stream.boundary
                cursor.insertBlock()  # the open block starts a paragraph of its own
                stream.tail_start = cursor.position()
            if stream.closed < len(text):
                cursor.insertHtml(self._part_html(stream, answer, stream.closed, len(text)))

        self._keep_bottom(update)

    def _begin_stream(self, before: list[Message], answer: Message) -> None:
        if self._shown != ([id(m) for m in before], True):  # else the document already ends with them
            self.show_messages(before, answer_follows=True)
        self.messages = list(before) + [answer]
        self._shown = ([], False)  # the document now holds more than show_messages rendered
        index = len(before)
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.End)
        if before:
            cursor.insertBlock()
        header_start = cursor.position()
        _insert_into_block(cursor, message_header_html(index, answer, self.options, last=True, streaming=True))
        cursor.insertBlock()
        self._stream = _Stream(index, [id(m) for m in before], header_start, tail_start=cursor.position())

    def finish(self, messages: list[Message]) -> None:
        """The answer that streamed is done: rewrite only it (with its stats and actions), so a
        selection above it survives; any other change re-renders the whole conversation."""
        stream = self._stream
        if stream is None or len(messages) != stream.message_index + 1 or \
                [id(m) for m in messages[:-1]] != stream.before:
            self.show_messages(messages)
            return
        self._stream = None
        self.messages = list(messages)
        self._shown = ([id(m) for m in messages], False)

        def update() -> None:
            cursor = QTextCursor(self.document())
            cursor.setPosition(stream.header_start)
            cursor.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
            cursor.removeSelectedText()
            _insert_into_block(cursor, self._message_html(stream.message_index, messages[-1], last=True))

        self._keep_bottom(update)

    @staticmethod
    def _scan(stream: _Stream, text: str) -> None:
        """Finds block boundaries in the text added since the last scan (whole lines only)."""
        end = text.rfind("\n") + 1
        for line_end in _line_ends(text, stream.scanned, end):
            line = text[stream.scanned : line_end].strip()
            if line.startswith(("```", "~~~")):
                stream.in_fence = not stream.in_fence
            elif not line and not stream.in_fence:
                stream.boundary = line_end
            stream.scanned = line_end

    def _part_html(self, stream: _Stream, answer: Message, start: int, end: int) -> str:
        return answer_part_html(stream.message_index, answer.content, stream.owners, answer.tokens, self.options,
                                start, end, first_code_block=stream.code_blocks)

    def _keep_bottom(self, change) -> None:
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4 or bar.value() == self._pinned
        change()
        self._pinned = None
        if at_bottom:
            self._pin_to_bottom()

    def _pin_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
        self._pinned = bar.value()

    def _follow_growth(self) -> None:
        if self._restoring is not None:
            self._apply_position()
        elif self._pinned is not None and self.verticalScrollBar().value() == self._pinned:
            self._pin_to_bottom()

    def position(self) -> float:
        """How far down the conversation is read: 0 at its top, 1 at its end."""
        bar = self.verticalScrollBar()
        return 1.0 if bar.maximum() <= 0 else bar.value() / bar.maximum()

    def restore_position(self, fraction: float) -> None:
        """Scrolls to `fraction` of the conversation (position()), also while Qt lays the rest of a
        long one out, until the user scrolls (at the end: pinned there, as after show_messages)."""
        if fraction >= 0.999:
            self._pin_to_bottom()
            return
        self._restoring = fraction
        self._apply_position()
        QTimer.singleShot(2000, self._stop_restoring)  # the layout is done by then

    def _apply_position(self) -> None:
        bar = self.verticalScrollBar()
        self._pinned = None
        bar.setValue(round(self._restoring * bar.maximum()))

    def _stop_restoring(self) -> None:
        self._restoring = None

    # ---- tokens and actions -------------------------------------------------------------------
    def token_at(self, href: str) -> TokenRecord | None:
        where = parse_href(href)
        if where is None or where[0] >= len(self.messages):
            return None
        tokens = self.messages[where[0]].tokens
        return tokens[where[1]] if where[1] < len(tokens) else None

    def _on_anchor(self, url: QUrl) -> None:
        action = parse_action(url.toString())
        if action is not None:
            self.action_requested.emit(*action)

    def token_at_caret(self) -> TokenRecord | None:
        """The answer token just after the keyboard caret (or the one it ends), if any."""
        position = self.textCursor().position()
        block = self.document().findBlock(position)
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.position() <= position < fragment.position() + fragment.length() or \
                    fragment.position() + fragment.length() == position:
                token = self.token_at(fragment.charFormat().anchorHref())
                if token is not None:
                    return token
            it += 1
        return None

    def _caret_moved(self) -> None:
        if not self.hasFocus():  # the document changed under it (streaming), not the user's caret
            return
        token = self.token_at_caret()
        self.token_focused.emit("; ".join(token_details(token)) if token is not None else "")

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        token = self.token_at(self.anchorAt(event.position().toPoint()))
        if token is not None:
            QToolTip.showText(event.globalPosition().toPoint(), token_tooltip(token), self)
        else:
            QToolTip.hideText()
        super().mouseMoveEvent(event)


def _insert_into_block(cursor: QTextCursor, html: str) -> None:
    """Insert html whose first paragraph takes over the cursor's empty block. insertHtml keeps
    that block's own format: a header would lose its margins, and after removing an answer
    that ended in a list (Qt merges the removed blocks into this one), show as a numbered item."""
    if cursor.currentList() is not None:
        cursor.currentList().remove(cursor.block())
    rendered = QTextDocument()
    rendered.setHtml(html)
    cursor.setBlockFormat(rendered.begin().blockFormat())
    cursor.insertHtml(html)


def _line_ends(text: str, start: int, end: int):
    """Positions just after each newline in text[start:end]."""
    position = text.find("\n", start, end)
    while position >= 0:
        yield position + 1
        position = text.find("\n", position + 1, end)
