"""What a user of a desktop chat app expects of the window, through pytest-qt on tiny models."""
import json

import pytest

from app.chat.store import ChatStore

from tests.test_gui import close_window, make_window, send_and_wait, tiny_models  # noqa: F401 (fixtures)

pytest.importorskip("pytestqt")


def test_the_last_chat_reopens_with_the_message_being_typed(qtbot, make_window):
    window = make_window()
    send_and_wait(qtbot, window, "t1 t2 t3")
    send_and_wait(qtbot, window, "t4 t5")
    chat_id, shown = window.conversation.id, [m.content for m in window.conversation.messages]
    window.composer.setPlainText("t7 half typed")
    close_window(window)

    again = make_window()
    assert again.conversation.id == chat_id
    assert [m.content for m in again.conversation.messages] == shown
    assert again.chat_view.messages == again.conversation.messages  # shown, not only loaded
    assert again.composer.toPlainText() == "t7 half typed"
    assert again.chat_list.selectedItems()[0].text() == again.conversation.title

    # deleted meanwhile (by another window on the same file): a new chat, as at a first start
    close_window(again)
    other = ChatStore(again.store.path)
    other.delete_chat(chat_id)
    other.close()
    with_chat_gone = make_window()
    assert with_chat_gone.conversation.id is None and not with_chat_gone.conversation.messages


def test_a_chat_read_halfway_reopens_there(qtbot, make_window):
    window = make_window(max_new_tokens=200)
    window.resize(900, 500)
    for _ in range(3):
        send_and_wait(qtbot, window, "t1 t2 t3 t4 t5 t6 t7 t8")
    bar = window.chat_view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0, timeout=5000)
    bar.setValue(bar.maximum() // 2)
    read = window.chat_view.position()
    assert 0.3 < read < 0.7
    close_window(window)

    again = make_window(max_new_tokens=200)
    qtbot.waitUntil(lambda: again.chat_view.verticalScrollBar().maximum() > 0, timeout=5000)
    qtbot.waitUntil(lambda: abs(again.chat_view.position() - read) < 0.05, timeout=5000)


def test_rename_and_delete_wait_for_a_chat_that_is_saved(qtbot, make_window):
    window = make_window()
    assert window.conversation.id is None
    assert not window.rename_button.isEnabled() and not window.delete_button.isEnabled()
    send_and_wait(qtbot, window)
    assert window.rename_button.isEnabled() and window.delete_button.isEnabled()
    window.new_chat()
    assert not window.rename_button.isEnabled()


def test_the_markdown_export_keeps_the_system_prompt_and_tells_no_acceptance_of_a_plain_answer(qtbot, make_window):
    from app.chat.export import to_markdown

    window = make_window(speculative=False, k=3, adaptive=False)  # (a fixed k drafts at every step)
    window.controller.set_system_prompt("Answer in t-words.")
    send_and_wait(qtbot, window)
    exported = to_markdown(window.conversation)
    assert "**System prompt:**\n\nAnswer in t-words." in exported
    assert "plain" in exported and "acceptance" not in exported
    window.controls.speculative.setChecked(True)
    send_and_wait(qtbot, window)
    assert to_markdown(window.conversation).count("acceptance") == 1  # the speculative answer's


def test_the_terminal_colours_tokens_as_the_window_does():
    from app.engine.api import Source
    from app.terminal import ANSI
    from app.ui.theme import DARK

    for source in (Source.ACCEPTED, Source.CORRECTED, Source.BONUS):
        red, green, blue = (int(DARK.colour(source)[i:i + 2], 16) for i in (1, 3, 5))
        assert ANSI[source] == f"\033[38;2;{red};{green};{blue}m"


def test_no_tooltip_says_the_gpu_runs_only_bfloat16(make_window):
    window = make_window()
    assert "always runs bfloat16" not in window.controls.precision.toolTip()


def unnamed_controls(root, tabs=()):
    """The interactive widgets under `root`, as shown on each page of each of `tabs`, whose
    accessibility interface gives no name (what a screen reader would say nothing for)."""
    from PySide6.QtGui import QAccessible
    from PySide6.QtWidgets import (QAbstractButton, QAbstractItemView, QAbstractSpinBox, QComboBox, QLineEdit,
                                   QPlainTextEdit, QTabBar, QTextEdit, QWidget)

    interactive = (QAbstractButton, QComboBox, QLineEdit, QTextEdit, QPlainTextEdit, QAbstractSpinBox,
                   QAbstractItemView, QTabBar)
    unnamed = set()
    for tab_widget in tabs or [None]:
        for page in range(tab_widget.count() if tab_widget else 1):
            if tab_widget:
                tab_widget.setCurrentIndex(page)
            for widget in root.findChildren(QWidget):
                # a spin box's own line edit, a table's header: parts of the control named
                inner = isinstance(widget.parent(), (QAbstractSpinBox, QComboBox, QAbstractItemView))
                if isinstance(widget, interactive) and widget.isVisibleTo(root) and not inner:
                    interface = QAccessible.queryAccessibleInterface(widget)
                    if not (interface and interface.text(QAccessible.Name).strip()):
                        unnamed.add(f"{type(widget).__name__} {widget.toolTip()[:30]!r}")
    return unnamed


def test_every_control_has_a_name_a_screen_reader_says(qtbot, make_window):
    window = make_window()
    assert not unnamed_controls(window, [window.controls])
    dialog = window.models.show_models()
    assert not unnamed_controls(dialog, [dialog.tabs])


def test_chats_are_listed_with_their_day():
    from datetime import date

    from app.ui.chat_list import day_words

    today = date(2026, 12, 7)
    assert [day_words(d, today) for d in (date(2026, 12, 7), date(2026, 12, 6), date(2026, 11, 30),
                                          date(2025, 12, 7))] == ["Today", "Yesterday", "30 Nov", "7 Dec 2025"]


def test_the_chat_list_has_dates_and_shortcuts_from_the_message_box(qtbot, make_window, monkeypatch):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QInputDialog, QMessageBox

    from app.ui.chat_list import WHEN_ROLE

    window = make_window()
    for text in ("t1 first", "t2 second"):
        window.new_chat()
        send_and_wait(qtbot, window, text)
    newest = window.chat_list.item(0)
    assert newest.data(WHEN_ROLE) == "Today" and newest.data(Qt.AccessibleTextRole) == "t2 second, Today"
    second, first = (window.chat_list.item(row).data(Qt.UserRole) for row in (0, 1))  # newest first
    window.activateWindow()  # (window shortcuts go to the active window)
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    window.composer.setFocus()
    qtbot.keyClick(window.composer, Qt.Key_PageDown, Qt.ControlModifier)  # next chat: the older one
    assert window.conversation.id == first
    qtbot.keyClick(window.composer, Qt.Key_PageUp, Qt.ControlModifier)
    assert window.conversation.id == second
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *args, **kwargs: ("renamed", True)))
    qtbot.keyClick(window.composer, Qt.Key_F2)
    assert window.conversation.title == "renamed" and window.chat_list.item(0).text() == "renamed"
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *args, **kwargs: QMessageBox.Yes))
    qtbot.keyClick(window.composer, Qt.Key_D, Qt.ControlModifier | Qt.ShiftModifier)
    assert window.chat_list.count() == 1 and window.conversation.id is None
    qtbot.keyClick(window.composer, Qt.Key_F, Qt.ControlModifier)
    assert window.search.hasFocus()


def test_a_chat_exported_as_json_imports_back_exactly_colours_included(qtbot, make_window, tmp_path):
    from tests.test_gui import token_fragments

    window = make_window(max_new_tokens=12, temperature=0.8, sampling_seed=7)
    window.controller.set_system_prompt("Answer in t-words.")
    send_and_wait(qtbot, window, "t1 t2 t3")
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.regenerate_button.click()  # a second version
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.compare_button.click()  # Compare's result and the seed, in the stats
    original = window.conversation
    assert original.messages[-1].stats.comparison is not None and len(original.messages[-1].versions) == 2
    colours = token_fragments(window)
    window.export_json(str(tmp_path / "chat.json"))
    exported = json.loads((tmp_path / "chat.json").read_text())
    answer = exported["messages"][-1]
    assert [t["id"] for t in answer["tokens"]] == list(original.messages[-1].stats.token_ids)
    assert {"text", "source", "p_target", "p_draft"} <= set(answer["tokens"][0])
    assert json.loads(answer["stats"]["made_with"])["seed"] == 7

    window.import_chat(str(tmp_path / "chat.json"))
    imported = window.conversation
    assert imported.id != original.id and window.chat_list.count() == 2
    assert (imported.title, imported.system_prompt) == (original.title, original.system_prompt)
    kept = lambda m: (m.role, m.content, m.tokens, m.stats, m.versions, m.shown, m.created)
    assert [kept(m) for m in imported.messages] == [kept(m) for m in original.messages]
    assert token_fragments(window) == colours
    window.open_chat(imported.id)  # as saved, read back from the file of chats
    assert [kept(m) for m in window.conversation.messages] == [kept(m) for m in original.messages]

    # a file that is no chat: said in one line, nothing changes
    (tmp_path / "other.json").write_text('{"messages": []}')
    window.import_chat(str(tmp_path / "other.json"))
    assert "Not a chat exported by SpecChat" in window.last_error and window.chat_list.count() == 2
    (tmp_path / "cut.json").write_text((tmp_path / "chat.json").read_text()[:500])
    window.import_chat(str(tmp_path / "cut.json"))
    assert "Not a JSON file" in window.last_error and window.chat_list.count() == 2


def test_accepted_tokens_can_be_told_apart_other_than_by_colour(qtbot, make_window):
    from PySide6.QtGui import QTextCharFormat

    window = make_window(k=3, adaptive=False, lookup=False)
    send_and_wait(qtbot, window)

    def underline_by_source():
        found = {}
        block = window.chat_view.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                token = window.chat_view.token_at(fragment.charFormat().anchorHref())
                if token is not None and fragment.text().strip():
                    found.setdefault(token.source.value, set()).add(fragment.charFormat().underlineStyle())
                it += 1
            block = block.next()
        return found

    assert underline_by_source()["accepted"] == {QTextCharFormat.NoUnderline}
    window.marks_action.setChecked(True)
    assert underline_by_source()["accepted"] == {QTextCharFormat.DotLine}
    assert "text-underline-style:dotted" in window.legend.text()


def test_fork_from_any_message_keeps_the_original_and_outlives_it(qtbot, make_window, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    window = make_window(max_new_tokens=8)
    send_and_wait(qtbot, window, "t1 t2")
    send_and_wait(qtbot, window, "t3 t4")
    original = window.conversation
    assert 'act:fork:1:0' in window.chat_view.toHtml()  # a fork link under each message
    window.messages.on_message_action("fork", 1, 0)  # from the second message: the first answer
    fork = window.conversation
    assert fork.id != original.id and fork.title == f"{original.title} (fork)" and fork.parent_id == original.id
    assert [m.content for m in fork.messages] == [m.content for m in original.messages[:2]]
    assert [m.tokens for m in fork.messages] == [m.tokens for m in original.messages[:2]]  # colours too
    assert len(ChatStore(window.store.path).load_chat(original.id).messages) == 4  # the original is whole
    rows = [window.chat_list.item(r).text() for r in range(window.chat_list.count())]
    assert rows == [original.title, f"\u21b3 {fork.title}"]  # under the chat it was made from
    send_and_wait(qtbot, window, "t5")  # the fork goes on from there
    assert len(window.conversation.messages) == 4 and window.conversation.messages[2].content == "t5"

    window.open_chat(original.id)
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *args, **kwargs: QMessageBox.Yes))
    window.delete_chat()
    assert [window.chat_list.item(r).text() for r in range(window.chat_list.count())] == [fork.title]
    assert ChatStore(window.store.path).load_chat(fork.id).parent_id is None


def test_flipping_an_earlier_answer_forks_instead_of_changing_the_later_turns_context(qtbot, make_window):
    window = make_window(max_new_tokens=8, temperature=1.0)
    send_and_wait(qtbot, window, "t1 t2")
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.regenerate_button.click()
    send_and_wait(qtbot, window, "t3 t4")
    original = window.conversation
    first_answer = original.messages[1]
    assert first_answer.shown == 1 and 'act:version:1:0' in window.chat_view.toHtml()
    window.messages.on_message_action("version", 1, 0)
    fork = window.conversation
    assert fork.id != original.id and len(fork.messages) == 2 and fork.messages[1].shown == 0
    assert fork.messages[1].content == first_answer.versions[0].content
    kept = ChatStore(window.store.path).load_chat(original.id)
    assert kept.messages[1].shown == 1 and len(kept.messages) == 4  # the later turn keeps its context
    # the last answer still flips in place
    window.open_chat(original.id)
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.regenerate_button.click()
    window.messages.on_message_action("version", 3, 0)
    assert window.conversation.id == original.id and window.conversation.messages[3].shown == 0


def test_a_tokens_source_is_read_without_the_mouse(qtbot, make_window):
    from PySide6.QtCore import Qt

    window = make_window(k=3, adaptive=False, lookup=False)
    answer = send_and_wait(qtbot, window, "t1 t2")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    window.chat_view.setFocus()
    qtbot.waitUntil(window.chat_view.hasFocus, timeout=5000)
    qtbot.keyClick(window.chat_view, Qt.Key_End, Qt.ControlModifier)  # the caret to the answer's end
    for _ in range(3):
        qtbot.keyClick(window.chat_view, Qt.Key_Left)
    token = window.chat_view.token_at_caret()
    assert token is not None and token in answer.tokens
    details = window.token_details.text()
    assert window.token_details.isVisible() and details.startswith(f"{token.source.value}: ")
    assert f"p_target {token.p_target:.3f}" in details
    assert window.chat_view.accessibleDescription() == details  # what a screen reader says of the view


def test_the_charts_have_axes_and_show_the_drafted_lengths(qtbot, make_window):
    from collections import Counter

    window = make_window(k=3, adaptive=False, lookup=False)
    answer = send_and_wait(qtbot, window)
    histogram, trace = window.acceptance.histogram, window.acceptance.trace
    drafted = Counter(answer.stats.drafted_lengths)
    assert drafted and histogram.drafted == dict(drafted)  # recorded per step, now shown
    assert histogram.counts == dict(Counter(answer.stats.accepted_lengths))
    most = max([*drafted.values(), *histogram.counts.values()])
    assert histogram.axis_labels()[0] == f"{most} step{'s' if most != 1 else ''}"
    assert trace.axis_labels() == ("100%", "0%", f"step 1 to {len(answer.stats.acceptance_trace)}")
    assert not histogram.grab().isNull() and not trace.grab().isNull()  # they paint with them
