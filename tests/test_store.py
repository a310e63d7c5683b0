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
    return Message("assistant", text, tokens, stats or AnswerStats(mode="speculative", emitted=2, seconds=0.5,
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
        store.add_message(chat, Message("assistant", f"message {i}", tokens, AnswerStats(emitted=i)))
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
    assert [m.stats.emitted for m in messages] == list(range(len(messages)))


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


def saved_chat(path, messages=3):
    store = ChatStore(path)
    chat = Conversation(title="kept")
    for index in range(messages):
        store.add_message(chat, Message("user", f"message {index} " + "z" * 5000))
    store.close()
    return chat


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed page"])
def test_a_damaged_database_is_moved_aside_and_a_new_one_starts(tmp_path, damage):
    path = tmp_path / "c.sqlite3"
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 100)
    else:
        saved_chat(path, messages=40)
        data = bytearray(path.read_bytes())
        if damage == "truncated":
            data = data[: len(data) // 2]
        else:
            page = 4096
            data[3 * page : 5 * page] = bytes(2 * page)  # pages of the messages' tree, gone
        path.write_bytes(bytes(data))
    damaged = path.read_bytes()
    store = ChatStore(path)
    assert store.damaged_copy is not None and store.damaged_copy.name.startswith("c.sqlite3.damaged-")
    assert store.damaged_copy.read_bytes() == damaged  # kept as it was, for the user to rescue
    assert store.list_chats() == []
    saved_chat(path, messages=1)  # the new one works
    assert ChatStore(path).damaged_copy is None


def test_a_database_that_cannot_be_opened_is_not_moved_aside(tmp_path):
    path = tmp_path / "c.sqlite3"
    path.mkdir()  # a folder in its place: an error, but no damage of ours to mend
    with pytest.raises(StoreError, match="Cannot open the chats"):
        ChatStore(path)
    assert path.is_dir() and list(tmp_path.iterdir()) == [path]


SIZE_LIMITED = textwrap.dedent("""
    import os, resource, signal, sys
    from app.chat.conversation import Conversation, Message
    from app.chat.store import ChatStore, StoreError
    store = ChatStore(sys.argv[1])
    chat = Conversation(title="t")
    store.add_message(chat, Message("user", "first"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
    size = os.path.getsize(sys.argv[1]) + os.path.getsize(sys.argv[1] + "-wal")
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4096, size + 4096))
    try:
        store.add_message(chat, Message("user", "y" * 200000))
    except StoreError as error:
        print("refused:", error)
""")


def test_an_io_error_while_writing_is_a_clear_error_and_keeps_what_was_saved(tmp_path):
    path = tmp_path / "c.sqlite3"
    result = subprocess.run([sys.executable, "-c", SIZE_LIMITED, str(path)], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)), timeout=60)
    assert "refused: Could not save the message" in result.stdout, result.stderr
    chats = ChatStore(path).list_chats()
    assert [m.content for m in ChatStore(path).load_chat(chats[0][0]).messages] == ["first"]


def test_a_message_whose_chat_another_process_deleted_is_not_lost_silently(tmp_path):
    path = tmp_path / "c.sqlite3"
    ours, theirs = ChatStore(path), ChatStore(path)
    chat = Conversation(title="t")
    ours.add_message(chat, Message("user", "question"))
    growing = answer()
    ours.add_message(chat, growing)
    theirs.delete_chat(chat.id)
    growing.content += " and more"
    with pytest.raises(StoreError, match="no longer there"):
        ours.update_message(growing)
    with pytest.raises(StoreError, match="Could not save"):  # a foreign key failure, not a raw sqlite3 error
        ours.add_message(chat, Message("user", "next"))


def test_the_chats_are_private(tmp_path):
    path = tmp_path / "data" / "c.sqlite3"
    store = ChatStore(path)
    store.add_message(Conversation(title="t"), Message("user", "private"))
    assert path.parent.stat().st_mode & 0o777 == 0o700
    for file in path.parent.iterdir():  # the database and its journal files
        assert file.stat().st_mode & 0o777 == 0o600, file
