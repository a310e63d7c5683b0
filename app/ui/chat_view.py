"""The conversation view: streamed answers, token colours, and a tooltip per token."""
from __future__ import annotations

from PySide6.QtGui import QMouseEvent
from PySide6.QtWidgets import QTextBrowser, QToolTip

from ..chat.conversation import Message, TokenRecord
from .render import RenderOptions, conversation_html, parse_href
from .theme import SOURCE_HELP


def token_tooltip(token: TokenRecord) -> str:
    lines = [f"<b>{token.source}</b>: {SOURCE_HELP.get(token.source, '')}", f"p_target {token.p_target:.3f}"]
    if token.p_draft is not None:
        lines.append(f"p_draft {token.p_draft:.3f}")
    if token.replaced is not None:
        lines.append(f"replaced draft token {token.replaced!r}")
    return "<br>".join(lines)


class ChatView(QTextBrowser):
    def __init__(self, options: RenderOptions) -> None:
        super().__init__()
        self.options = options
        self.messages: list[Message] = []
        self.setOpenLinks(False)
        self.setMouseTracking(True)
        self.viewport().setMouseTracking(True)
        self.setPlaceholderText("Ask anything. Tokens are coloured by where they came from.")

    def show_messages(self, messages: list[Message]) -> None:
        """Render `messages` (the last may still be streaming); stays at the bottom if it was there."""
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        self.messages = messages
        self.setHtml(conversation_html(messages, self.options))
        if at_bottom:
            bar.setValue(bar.maximum())

    def set_options(self, options: RenderOptions) -> None:
        self.options = options
        self.show_messages(self.messages)

    def token_at(self, href: str) -> TokenRecord | None:
        where = parse_href(href)
        if where is None or where[0] >= len(self.messages):
            return None
        tokens = self.messages[where[0]].tokens
        return tokens[where[1]] if where[1] < len(tokens) else None

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        token = self.token_at(self.anchorAt(event.position().toPoint()))
        if token is not None:
            QToolTip.showText(event.globalPosition().toPoint(), token_tooltip(token), self)
        else:
            QToolTip.hideText()
        super().mouseMoveEvent(event)
