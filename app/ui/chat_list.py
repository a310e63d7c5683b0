"""The chat list's rows: each chat's title, elided, and the day it was last written in (Today,
Yesterday, then the date), right-aligned and muted, as other chat apps list them."""
from __future__ import annotations

from datetime import date, timedelta

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

WHEN_ROLE = Qt.UserRole + 1  # the row's day in words
_GAP = 8  # pixels between the title and the day


def day_words(day: date, today: date) -> str:
    if day == today:
        return "Today"
    if day == today - timedelta(days=1):
        return "Yesterday"
    return f"{day.day} {day:%b}" + (f" {day.year}" if day.year != today.year else "")


def forks_under_parents(chats: list[tuple[int, str, float]], forks: dict[int, int]) -> list[tuple[int, str, float, int]]:
    """chats (id, title, updated), newest first, with each fork moved under the chat it was made
    from when that is listed too: (id, title, updated, depth)."""
    listed = {chat[0] for chat in chats}
    children: dict[int, list] = {}
    for chat in chats:
        if forks.get(chat[0]) in listed:
            children.setdefault(forks[chat[0]], []).append(chat)
    ordered = []

    def add(chat, depth: int) -> None:
        ordered.append((*chat, depth))
        for child in children.get(chat[0], []):
            add(child, depth + 1)
    for chat in chats:
        if forks.get(chat[0]) not in listed:
            add(chat, 0)
    return ordered


class ChatListDelegate(QStyledItemDelegate):
    def paint(self, painter, option, index) -> None:
        when = index.data(WHEN_ROLE)
        if not when:
            super().paint(painter, option, index)
            return
        widget = option.widget
        style = widget.style() if widget is not None else None
        if style is not None:  # the row's selection and hover background, across the whole row
            style.drawPrimitive(QStyle.PE_PanelItemViewItem, option, painter, widget)
        title = QStyleOptionViewItem(option)
        title.rect = option.rect.adjusted(0, 0, -(option.fontMetrics.horizontalAdvance(when) + 2 * _GAP), 0)
        super().paint(painter, title, index)
        painter.save()
        selected = option.state & QStyle.State_Selected
        painter.setPen(option.palette.color(QPalette.HighlightedText if selected else QPalette.PlaceholderText))
        painter.drawText(option.rect.adjusted(0, 0, -_GAP, 0), Qt.AlignRight | Qt.AlignVCenter, when)
        painter.restore()
