"""Persistence: reload, search, rename/delete, export, a kill mid-write, a full disk."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from app.chat.conversation import AnswerStats, Conversation, Message, TokenRecord
from app.chat.export import to_markdown
from app.chat.store import ChatStore, StoreError


def answer(text="Hello world", stats=None):
    tokens = [TokenRecord("Hello", "accepted", 0.9, None, copied=True),
              TokenRecord(" world", "corrected", 0.7, 0.1, replaced=" there")]
    return Message("assistant", text, tokens, stats or AnswerStats(mode="speculative", tokens=2, seconds=0.5,
                                                                    drafted=2, accepted=1, target_passes=1, looked_up=1))


def test_round_trip_search_rename_delete(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    chat = Conversation(title="Greetings")
    store.add_message(chat, Message("user", "say hello"))
    store.add_message(chat, answer())
    other = Conversation(title="Maths")
    store.add_message(other, Message("user", "2+2"))
    store.close()

    store = ChatStore(tmp_path / "c.sqlite3")
    loaded = store.load_chat(chat.id)
    assert [m.role for m in loaded.messages] == ["user", "assistant"]
    assert loaded.messages[1].tokens[1].replaced == " there"
    assert [t.copied for t in loaded.messages[1].tokens] == [True, False] and loaded.messages[1].stats.looked_up == 1
    assert [row[1] for row in store.list_chats("hello")] == ["Greetings"]
    store.rename_chat(chat.id, "Hi")
    assert {row[1] for row in store.list_chats()} == {"Hi", "Maths"}
    store.delete_chat(other.id)
    assert [row[1] for row in store.list_chats()] == ["Hi"]
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2


def test_markdown_export():
    chat = Conversation(title="Greetings", messages=[Message("user", "say hello"), answer()])
    text = to_markdown(chat)
    assert text.startswith("# Greetings")
    assert "**You:**" in text and "Hello world" in text and "acceptance 50%" in text and "mean accepted length 2.00" in text


WRITER = textwrap.dedent("""
    import sys
    from app.chat.conversation import AnswerStats, Conversation, Message, TokenRecord
    from app.chat.store import ChatStore
    store = ChatStore(sys.argv[1])
    chat = Conversation(title="stress")
    tokens = [TokenRecord("x" * 50, "accepted", 0.5, 0.5)] * 400
    for i in range(100000):
        store.add_message(chat, Message("assistant", f"message {i}", tokens, AnswerStats(tokens=i)))
        print(i, flush=True)
""")


def test_store_survives_a_kill_mid_write(tmp_path):
    path = tmp_path / "c.sqlite3"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(__file__)))
    done = -1
    deadline = time.time() + 60
    while done < 30 and time.time() < deadline:
        done = int(writer.stdout.readline())
    writer.send_signal(signal.SIGKILL)  # no cleanup, possibly inside a transaction
    writer.wait()
    assert done >= 30
    store = ChatStore(path)
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    (chat_id, _, _), = store.list_chats()
    messages = store.load_chat(chat_id).messages
    assert len(messages) >= done + 1  # every message reported as saved is there, whole
    assert all(len(m.tokens) == 400 for m in messages)
    assert [m.stats.tokens for m in messages] == list(range(len(messages)))


def test_full_disk_is_a_clear_error_and_keeps_saved_messages(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    chat = Conversation(title="t")
    store.add_message(chat, Message("user", "first"))
    page_size = store.db.execute("PRAGMA page_size").fetchone()[0]
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")  # the database cannot grow: as on a full disk
    with pytest.raises(StoreError, match="Could not save the message.*earlier messages are safe"):
        store.add_message(chat, Message("user", "y" * (page_size * 4)))
    assert [m.content for m in store.load_chat(chat.id).messages] == ["first"]
