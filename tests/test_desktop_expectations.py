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


def test_presets_are_picked_per_chat_saved_shared_and_the_built_in_ones_stay(qtbot, make_window, tmp_path):
    from app.chat.presets import BUILT_IN_NAMES, PresetBook, PresetError

    window = make_window()
    presets, c = window.presets, window.controls
    assert {"Precise", "Creative", "Code"} <= set(presets.book.names())
    # a preset for the open chat: the controls take its settings, the chat its name and system prompt
    presets.pick("Code")
    assert c.temperature.value() == 0.0 and c.max_new_tokens.value() == 2048
    assert window.conversation.system_prompt.startswith("You are an expert programmer")
    c.max_new_tokens.setValue(24)
    presets.pick("Creative")
    assert c.temperature.value() == pytest.approx(0.9) and c.top_p.value() == pytest.approx(0.95)
    with pytest.raises(PresetError):
        presets.book.delete("Creative")
    assert presets.combo.currentData() == "Creative" and not presets.delete_action.isEnabled()

    # the current settings saved as a preset, applied to another chat, which keeps it
    c.temperature.setValue(0.4)
    c.k.setValue(5)
    c.adaptive.setChecked(False)
    c.max_new_tokens.setValue(20)
    window.controller.set_system_prompt("Answer in t-words only.")
    presets.save_current("Terse")
    send_and_wait(qtbot, window, "t1 t2")
    first_chat = window.conversation.id
    window.new_chat()
    window.controller.set_system_prompt("")
    presets.pick("Precise")
    assert c.temperature.value() == 0.0 and c.adaptive.isChecked()
    presets.pick("Terse")
    assert (c.temperature.value(), c.k.value(), c.adaptive.isChecked(), c.max_new_tokens.value()) == (0.4, 5, False, 20)
    assert window.conversation.system_prompt == "Answer in t-words only."
    send_and_wait(qtbot, window, "t3 t4")
    second_chat = window.conversation.id
    presets.pick("Precise")  # the settings change, and so does this chat's preset ...
    window.open_chat(first_chat)  # ... while the first chat keeps its own
    assert presets.combo.currentData() == "Terse" and c.temperature.value() == pytest.approx(0.4)
    assert window.store.load_chat(second_chat).preset == "Precise"

    # shared as a file: exported, imported into another book; a built-in name is kept apart
    exported = tmp_path / "terse.json"
    presets.export_current(str(exported))
    other = PresetBook(tmp_path / "elsewhere" / "presets.json")
    assert other.import_file(exported) == ["Terse"] and other.get("Terse") == presets.book.get("Terse")
    data = json.loads(exported.read_text())
    data["presets"][0]["name"] = "Precise"
    exported.write_text(json.dumps(data))
    assert other.import_file(exported) == ["Precise (imported)"]
    assert set(BUILT_IN_NAMES) <= set(other.names())
    # a damaged or foreign file is refused in one line, and the book stays as it was
    data["presets"][0]["temperature"] = 7
    exported.write_text(json.dumps(data))
    with pytest.raises(PresetError, match="temperature"):
        other.import_file(exported)
    (tmp_path / "notes.json").write_text('{"a": 1}')
    with pytest.raises(PresetError, match="not a presets file"):
        other.import_file(tmp_path / "notes.json")
    assert other.names() == PresetBook(other.path).names()


def test_a_context_length_bounds_the_chat_and_overflow_drops_the_oldest_turns_when_asked(qtbot, make_window, tmp_path):
    from app.chat.session import Overflow

    window = make_window(max_new_tokens=16)
    c = window.controls
    assert c.context.maximum() == 256  # the tiny model's own
    engine = window.controller.engine
    c.context.setValue(128)
    with qtbot.waitSignal(window.models_ready, timeout=20_000):
        c.context.editingFinished.emit()
    assert window.controller.engine.target.context_length == 128
    long_question = " ".join(f"t{i % 90 + 3}" for i in range(60))
    send_and_wait(qtbot, window, long_question)
    assert "/ 128 tokens" in window.acceptance.context.format()  # the meter shows the limit in force

    # stop and say so: the next question does not fit, and nothing is lost
    window.composer.setPlainText(long_question)
    window.send_button.click()
    assert not c.context.isEnabled() and not c.device_choice.isEnabled()  # no reload while it answers
    qtbot.waitUntil(lambda: window.last_error is not None and "128" in window.last_error, timeout=20_000)
    assert len(window.conversation.messages) == 3 and window.conversation.messages[-1].role == "user"

    # drop the oldest turns: answered, and the window says what was left out
    c.overflow.setCurrentIndex(c.overflow.findData(Overflow.DROP_OLDEST.value))
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.answer_pending()
    assert window.conversation.messages[-1].role == "assistant" and window.conversation.messages[-1].stats.emitted
    assert "2 oldest messages were left out" in window.statusBar().currentMessage()
    assert engine is not window.controller.engine

    # a document has the room of the whole context where older turns give way, else only what is left
    document = tmp_path / "notes.txt"
    document.write_text(long_question)
    window.messages.insert_files([document])
    assert "t3 t4 t5" in window.composer.toPlainText()
    window.composer.clear()
    c.overflow.setCurrentIndex(c.overflow.findData(Overflow.STOP.value))
    window.messages.insert_files([document])
    assert window.composer.toPlainText() == "" and "(of 128)" in window.statusBar().currentMessage()


def test_a_context_whose_caches_would_not_fit_is_refused_at_the_load(monkeypatch):
    from app.engine import memory_check
    from app.engine.engine import SpeculativeEngine
    from app.engine.errors import ModelError
    from tests.tiny import tiny_model

    target = tiny_model(seed=1)
    engine = SpeculativeEngine(target, tiny_model(seed=1))
    target.context_limit = 200
    engine.check_context_fits()  # a few kilobytes
    monkeypatch.setattr(memory_check, "memory_left", lambda: 2**20)  # 1 MiB left
    with pytest.raises(ModelError, match="A context of 200 tokens needs about"):
        engine.check_context_fits()


def text_pdf(path, pages: list[str]) -> None:
    """A PDF whose pages hold these lines of text (Helvetica), written object by object."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objects)} 0 R "
                       "/Resources << /Font << /F1 3 0 R >> >> >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(out)


def test_documents_go_in_as_text_with_their_size_and_one_too_long_or_scanned_is_refused(qtbot, make_window, tmp_path):
    import docx
    from pypdf import PdfWriter

    window = make_window()
    text_pdf(tmp_path / "report.pdf", ["t11 t12 t13", "t14 t15"])
    word = docx.Document()
    word.add_paragraph("t21 t22")
    word.add_table(rows=1, cols=2).rows[0].cells[0].text = "t23"
    word.save(tmp_path / "notes.docx")
    (tmp_path / "page.html").write_text("<html><head><style>p {}</style><script>t99()</script></head>"
                                        "<body><h1>t31</h1><p>t32 <b>t33</b></p></body></html>")
    window.messages.insert_files([tmp_path / "report.pdf", tmp_path / "notes.docx", tmp_path / "page.html"])
    typed = window.composer.toPlainText()
    assert "`report.pdf` (2 pages):" in typed and "t11 t12 t13\n\nt14 t15" in typed
    assert "`notes.docx` (" in typed and "t21 t22\nt23 |" in typed
    assert "t31\nt32\nt33" in typed and "t99" not in typed
    assert "Attached report.pdf (2 pages, " in window.statusBar().currentMessage()

    # a scanned PDF (pages without text) and one longer than the context's room: refused, nothing goes in
    scanned = PdfWriter()
    scanned.add_blank_page(612, 792)
    scanned.write(tmp_path / "scan.pdf")
    text_pdf(tmp_path / "book.pdf", [" ".join(f"t{i % 90 + 3}" for i in range(100))] * 4)
    window.composer.clear()
    window.messages.insert_files([tmp_path / "scan.pdf", tmp_path / "book.pdf"])
    said = window.statusBar().currentMessage()
    assert window.composer.toPlainText() == ""
    assert "scan.pdf (1 page) has no text layer" in said
    assert "book.pdf is 4" in said and "and the context has room for" in said and "(of 256)" in said
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    window.messages.insert_files([tmp_path / "broken.pdf"])
    assert "broken.pdf is not a PDF that can be read" in window.statusBar().currentMessage()


def test_the_device_is_chosen_in_the_window_and_specchat_device_overrides_it(qtbot, make_window, monkeypatch):
    from app.engine import devices

    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    monkeypatch.setattr(devices, "gpus", lambda: [("cuda:0", "RTX 4090")])  # what torch would list on such a machine
    window = make_window()
    c = window.controls
    assert [c.device_choice.itemData(i) for i in range(c.device_choice.count())] == ["auto", "cpu", "cuda:0"]
    assert c.device_choice.itemText(2) == "GPU 0: RTX 4090"
    with qtbot.waitSignal(window.models_ready, timeout=20_000):
        c.device_choice.setCurrentIndex(c.device_choice.findData("cpu"))
    assert c.device.text() == "CPU: chosen in the window"
    with qtbot.waitSignal(window.models_ready, timeout=20_000):  # this machine has no CUDA: said, and the CPU runs
        c.device_choice.setCurrentIndex(c.device_choice.findData("cuda:0"))
    assert c.device.text() == "CPU: the window asks for cuda:0, which torch does not see"
    monkeypatch.setenv("SPECCHAT_DEVICE", "cpu")
    with qtbot.waitSignal(window.models_ready, timeout=20_000):
        window.load_models()
    assert c.device.text() == "CPU: chosen by SPECCHAT_DEVICE, over the window's cuda:0"
    close_window(window)
    assert make_window().controls.device_choice.currentData() == "cuda:0"  # kept across a restart
