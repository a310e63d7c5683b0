"""SQLite persistence of conversations, one transaction per finished message.

SQLite's journal makes each write all-or-nothing, so a crash or kill mid-write leaves the
previous state intact; WAL mode lets readers go on while a write is under way.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

import platformdirs

from .conversation import AnswerStats, Conversation, Message, TokenRecord, Version

SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    updated REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    tokens TEXT NOT NULL,
    stats TEXT NOT NULL,
    created REAL NOT NULL,
    versions TEXT NOT NULL DEFAULT '[]',
    shown INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, id);
"""
# Columns added after the first release: (table, column, definition). A database made by an
# older version gains them on open; its rows get the defaults.
ADDED_COLUMNS = [
    ("chats", "system_prompt", "TEXT NOT NULL DEFAULT ''"),
    ("messages", "versions", "TEXT NOT NULL DEFAULT '[]'"),
    ("messages", "shown", "INTEGER NOT NULL DEFAULT 0"),
]


class StoreError(Exception):
    """Saving failed (disk full, read-only, ...); the message is for the user."""


def default_path() -> Path:
    base = os.environ.get("SPECCHAT_DATA") or platformdirs.user_data_dir("specchat")
    return Path(base) / "chats.sqlite3"


class ChatStore:
    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a finished message survives power loss too
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)
        for table, column, definition in ADDED_COLUMNS:
            if column not in {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self, what: str):
        """One transaction, all or nothing; a failure (disk full, read-only) becomes a StoreError."""
        try:
            with self.db:
                yield self.db
        except sqlite3.OperationalError as error:
            raise StoreError(f"Could not save {what} to {self.path}: {error}. "
                             "What is on screen stays; earlier messages are safe.") from error

    def _write(self, sql: str, args: tuple) -> int:
        with self._transaction("the change") as db:
            return db.execute(sql, args).lastrowid

    def create_chat(self, conversation: Conversation) -> None:
        conversation.id = self._write("INSERT INTO chats (title, updated, system_prompt) VALUES (?, ?, ?)",
                                      (conversation.title, conversation.updated, conversation.system_prompt))

    def add_message(self, conversation: Conversation, message: Message) -> None:
        if conversation.id is None:
            self.create_chat(conversation)
        now = time.time()
        with self._transaction("the message") as db:
            message.id = db.execute(
                "INSERT INTO messages (chat_id, role, content, tokens, stats, created, versions, shown) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation.id, message.role, message.content, json.dumps(message.tokens_as_dicts()),
                 _stats_json(message), message.created, _versions_json(message), message.shown),
            ).lastrowid
            db.execute("UPDATE chats SET updated = ?, title = ? WHERE id = ?", (now, conversation.title, conversation.id))
        conversation.updated = now

    def update_message(self, message: Message) -> None:
        """Rewrites a saved message (a growing answer, a finished one, a comparison added)."""
        with self._transaction("the message") as db:
            db.execute("UPDATE messages SET content = ?, tokens = ?, stats = ?, versions = ?, shown = ? WHERE id = ?",
                       (message.content, json.dumps(message.tokens_as_dicts()), _stats_json(message),
                        _versions_json(message), message.shown, message.id))

    def delete_message(self, message_id: int) -> None:
        self._write("DELETE FROM messages WHERE id = ?", (message_id,))

    def delete_messages_from(self, chat_id: int, message_id: int) -> None:
        """Deletes a message and every later one of its chat (an edited question resent)."""
        self._write("DELETE FROM messages WHERE chat_id = ? AND id >= ?", (chat_id, message_id))

    def set_system_prompt(self, chat_id: int, text: str) -> None:
        self._write("UPDATE chats SET system_prompt = ? WHERE id = ?", (text, chat_id))

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._write("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        self._write("DELETE FROM chats WHERE id = ?", (chat_id,))

    def list_chats(self, search: str = "") -> list[tuple[int, str, float]]:
        """(id, title, updated), newest first; `search` matches titles and message text."""
        if not search:
            return self.db.execute("SELECT id, title, updated FROM chats ORDER BY updated DESC").fetchall()
        pattern = f"%{search}%"
        return self.db.execute(
            "SELECT DISTINCT c.id, c.title, c.updated FROM chats c LEFT JOIN messages m ON m.chat_id = c.id "
            "WHERE c.title LIKE ? OR m.content LIKE ? ORDER BY c.updated DESC",
            (pattern, pattern),
        ).fetchall()

    def load_chat(self, chat_id: int) -> Conversation:
        row = self.db.execute("SELECT title, updated, system_prompt FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise KeyError(chat_id)
        conversation = Conversation(title=row[0], id=chat_id, updated=row[1], system_prompt=row[2])
        for message_id, role, content, tokens, stats, created, versions, shown in self.db.execute(
            "SELECT id, role, content, tokens, stats, created, versions, shown FROM messages WHERE chat_id = ? "
            "ORDER BY id", (chat_id,)
        ):
            conversation.messages.append(Message(
                role=role, content=content, tokens=[TokenRecord(**t) for t in json.loads(tokens)],
                stats=AnswerStats.from_dict(json.loads(stats)) if role == "assistant" else None,
                created=created, id=message_id, versions=[Version.from_dict(v) for v in json.loads(versions)],
                shown=shown,
            ))
        return conversation


def _stats_json(message: Message) -> str:
    return json.dumps(message.stats.to_dict() if message.stats else {})


def _versions_json(message: Message) -> str:
    return json.dumps([version.to_dict() for version in message.versions])
