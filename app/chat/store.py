"""SQLite persistence of conversations, one transaction per finished message.

SQLite's journal makes each write all-or-nothing, so a crash or kill mid-write leaves the
previous state intact; WAL mode lets readers go on while a write is under way. A file that is
not a database, or a damaged one, is moved aside under a name that says so (nothing is deleted)
and a new database starts in its place. The folder is owner-only and the file 0600.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

import platformdirs

from ..engine.files import PRIVATE_FILE, private_folder, sync_folder
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
    ("chats", "parent_id", "INTEGER"),  # the chat a fork was made from (not a foreign key: forks outlive it)
    ("chats", "preset", "TEXT NOT NULL DEFAULT ''"),  # the preset picked for the chat ('': none)
]


JOURNALS = ("-wal", "-shm", "-journal")  # the files SQLite keeps beside a database


class StoreError(Exception):
    """Saving or reading failed (disk full, read-only, damaged, ...); the message is for the user."""


def default_path() -> Path:
    base = os.environ.get("SPECCHAT_DATA") or platformdirs.user_data_dir("specchat")
    return Path(base) / "chats.sqlite3"


class ChatStore:
    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path else default_path()
        private_folder(self.path.parent)
        self.damaged_copy: Path | None = None  # where a damaged database was moved aside at this open
        self.damage = ""  # what SQLite said of it
        try:
            try:
                self.db = self._open()
            except sqlite3.OperationalError:  # cannot be opened or written (permissions, a full disk): as it is
                raise
            except sqlite3.DatabaseError as error:  # not a database, or damaged: kept aside, a new one here
                self.damaged_copy, self.damage = self._move_aside(), str(error)
                self.db = self._open()
        except (sqlite3.Error, OSError) as error:
            raise StoreError(f"Cannot open the chats in {self.path}: {error}") from error

    def _open(self) -> sqlite3.Connection:
        # owner-only before SQLite opens it: its journal files take the database's permissions
        if not self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
        for file in (self.path, *(self.path.with_name(self.path.name + end) for end in JOURNALS)):
            try:
                file.chmod(PRIVATE_FILE)
            except OSError:  # not there, or not ours to change
                pass
        db = sqlite3.connect(self.path)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a finished message survives power loss too
            db.execute("PRAGMA foreign_keys=ON")
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError("; ".join(problems[:3]))
            db.executescript(SCHEMA)
            for table, column, definition in ADDED_COLUMNS:
                if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        """Renames the damaged database, and its journal files with it (SQLite would replay them
        into the new one), to `<name>.damaged-<time>`."""
        aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", *JOURNALS):
            source = self.path.with_name(self.path.name + suffix)
            if source.exists():
                source.replace(aside.with_name(aside.name + suffix))
        sync_folder(self.path.parent)
        return aside

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self, what: str):
        """One transaction, all or nothing; any database failure (disk full, read-only, damaged)
        becomes a StoreError."""
        try:
            with self.db:
                yield self.db
        except sqlite3.Error as error:
            raise StoreError(f"Could not save {what} to {self.path}: {error}. "
                             "What is on screen stays; earlier messages are safe.") from error

    @contextmanager
    def _reading(self, what: str):
        try:
            yield self.db
        except sqlite3.Error as error:
            raise StoreError(f"Could not read {what} from {self.path}: {error}.") from error

    def _write(self, sql: str, args: tuple) -> int:
        with self._transaction("the change") as db:
            return db.execute(sql, args).lastrowid

    def create_chat(self, conversation: Conversation) -> None:
        conversation.id = self._write(CREATE_CHAT, _chat_row(conversation))

    def save_chat(self, conversation: Conversation) -> None:
        """A whole chat saved as a new one, in one transaction (a fork, an import)."""
        with self._transaction("the chat") as db:
            conversation.id = db.execute(CREATE_CHAT, _chat_row(conversation)).lastrowid
            for message in conversation.messages:
                message.id = db.execute(
                    "INSERT INTO messages (chat_id, role, content, tokens, stats, created, versions, shown) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (conversation.id, message.role, message.content, json.dumps(message.tokens_as_dicts()),
                     _stats_json(message), message.created, _versions_json(message), message.shown)).lastrowid

    def forks(self) -> dict[int, int]:
        """{fork's id: the id of the chat it was made from} (a parent deleted since: not listed)."""
        with self._reading("the chats") as db:
            return dict(db.execute("SELECT c.id, c.parent_id FROM chats c JOIN chats p ON p.id = c.parent_id"))

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
            changed = db.execute(
                "UPDATE messages SET content = ?, tokens = ?, stats = ?, versions = ?, shown = ? WHERE id = ?",
                (message.content, json.dumps(message.tokens_as_dicts()), _stats_json(message),
                 _versions_json(message), message.shown, message.id)).rowcount
        if changed != 1:
            raise StoreError(f"Could not save the message to {self.path}: it is no longer there (its chat was "
                             "deleted meanwhile). What is on screen stays until you leave this chat.")

    def delete_message(self, message_id: int) -> None:
        self._write("DELETE FROM messages WHERE id = ?", (message_id,))

    def delete_messages_from(self, chat_id: int, message_id: int) -> None:
        """Deletes a message and every later one of its chat (an edited question resent)."""
        self._write("DELETE FROM messages WHERE chat_id = ? AND id >= ?", (chat_id, message_id))

    def set_system_prompt(self, chat_id: int, text: str) -> None:
        self._write("UPDATE chats SET system_prompt = ? WHERE id = ?", (text, chat_id))

    def set_preset(self, chat_id: int, name: str) -> None:
        self._write("UPDATE chats SET preset = ? WHERE id = ?", (name, chat_id))

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._write("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        """Deletes a chat and its messages; its forks stay, as chats of their own."""
        with self._transaction("the deletion") as db:
            db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            db.execute("UPDATE chats SET parent_id = NULL WHERE parent_id = ?", (chat_id,))

    def list_chats(self, search: str = "") -> list[tuple[int, str, float]]:
        """(id, title, updated), newest first; `search` matches titles and message text."""
        with self._reading("the chats") as db:
            if not search:
                return db.execute("SELECT id, title, updated FROM chats ORDER BY updated DESC").fetchall()
            pattern = f"%{search}%"
            return db.execute(
                "SELECT DISTINCT c.id, c.title, c.updated FROM chats c LEFT JOIN messages m ON m.chat_id = c.id "
                "WHERE c.title LIKE ? OR m.content LIKE ? ORDER BY c.updated DESC",
                (pattern, pattern),
            ).fetchall()

    def recent_questions(self, count: int, min_chars: int = 20) -> list[str]:
        """The user's latest messages of at least min_chars characters, newest first, distinct."""
        with self._reading("the chats") as db:
            rows = db.execute("SELECT content FROM messages WHERE role = 'user' AND length(content) >= ? "
                              "ORDER BY id DESC LIMIT ?", (min_chars, 4 * count)).fetchall()
        return list(dict.fromkeys(content for (content,) in rows))[:count]

    def load_chat(self, chat_id: int) -> Conversation:
        with self._reading("the chat") as db:
            row = db.execute("SELECT title, updated, system_prompt, parent_id, preset FROM chats WHERE id = ?",
                             (chat_id,)).fetchone()
            if row is None:
                raise KeyError(chat_id)
            rows = db.execute("SELECT id, role, content, tokens, stats, created, versions, shown FROM messages "
                              "WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall()
        conversation = Conversation(title=row[0], id=chat_id, updated=row[1], system_prompt=row[2], parent_id=row[3],
                                    preset=row[4])
        for message_id, role, content, tokens, stats, created, versions, shown in rows:
            conversation.messages.append(Message(
                role=role, content=content, tokens=[TokenRecord(**t) for t in json.loads(tokens)],
                stats=AnswerStats.from_dict(json.loads(stats)) if role == "assistant" else None,
                created=created, id=message_id, versions=[Version.from_dict(v) for v in json.loads(versions)],
                shown=shown,
            ))
        return conversation


CREATE_CHAT = "INSERT INTO chats (title, updated, system_prompt, parent_id, preset) VALUES (?, ?, ?, ?, ?)"


def _chat_row(conversation: Conversation) -> tuple:
    return (conversation.title, conversation.updated, conversation.system_prompt, conversation.parent_id,
            conversation.preset)


def _stats_json(message: Message) -> str:
    return json.dumps(message.stats.to_dict() if message.stats else {})


def _versions_json(message: Message) -> str:
    return json.dumps([version.to_dict() for version in message.versions])
