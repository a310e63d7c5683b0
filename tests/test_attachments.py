"""A text file put into a message becomes a code block named after it; anything else is refused
with a message that names the file and why."""
import pytest

from app.chat import attachments
from app.chat.attachments import AttachmentError, file_block
from app.ui.markdown import code_blocks


def test_a_text_file_becomes_a_code_block_named_after_it(tmp_path):
    source = "def f():\n    return '``` inside'\n"
    path = tmp_path / "tool.py"
    path.write_text(source, encoding="utf-8")
    block = file_block(path)
    assert block.startswith("`tool.py`:\n````python\n")  # a fence longer than the backticks inside
    assert code_blocks(block) == [source]
    (tmp_path / "notes").write_text("no newline at the end", encoding="utf-8")
    assert code_blocks(file_block(tmp_path / "notes")) == ["no newline at the end\n"]


@pytest.mark.parametrize("make, reason", [
    (lambda d: (d / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00"), "not a text file"),
    (lambda d: (d / "latin1.txt").write_bytes("café".encode("latin-1")), "not a text file"),
    (lambda d: (d / "folder").mkdir(), "is a folder"),
    (lambda d: None, "cannot be read"),
    (lambda d: (d / "big.txt").write_text("x" * (attachments.MAX_BYTES + 1)), "MiB go into a message"),
])
def test_what_is_not_a_readable_text_file_is_refused_by_name(tmp_path, make, reason):
    make(tmp_path)
    name = next((p.name for p in tmp_path.iterdir()), "missing.txt")
    with pytest.raises(AttachmentError, match=reason) as error:
        file_block(tmp_path / name)
    assert name in str(error.value)


def test_a_chat_is_named_after_the_users_own_words_not_the_files_attached(tmp_path):
    from app.chat.attachments import document_block, message_title

    (tmp_path / "notes.md").write_text("# Notes\n```\ncode\n```\n")
    block, _ = document_block(tmp_path / "notes.md")
    assert message_title(block + "\nSummarise these notes.\nThen list the steps.") == "Summarise these notes."
    assert message_title("What is 2+3?\n" + block) == "What is 2+3?"
    assert message_title(block) == "notes.md"
    assert message_title("x" * 100) == "x" * 60
