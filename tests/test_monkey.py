"""A monkey: 300 random user actions on tiny models (send, also while models load, stop,
regenerate, edit, switch models, toggle speculation, change k, compare, new/open/delete chat, flip
versions) in any order and at any moment, with the real engine running. No exception may escape (pytest-qt fails the test on
one raised in Qt's event loop), no sent message may be lost, and the store must match the
window at the end. Run it alone with `python -m pytest -k monkey`."""
import random

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.chat.store import ChatStore
from tests.test_gui import make_window, tiny_models  # noqa: F401 (fixtures)

ACTIONS = 300


@pytest.mark.parametrize("seed", [4, 7])
def test_monkey_random_actions_lose_nothing(qtbot, make_window, monkeypatch, tmp_path, seed):
    monkeypatch.setattr(QMessageBox, "question", lambda *args, **kwargs: QMessageBox.Yes)
    rng = random.Random(seed)
    window = make_window(max_new_tokens=16, saved_caches=tmp_path / "saved-caches")  # saved at switches and deletes
    kept: set[str] = set()  # every user message sent and not removed by an edit or a delete
    counter = {"sent": 0, "done": {}}

    def texts_from(index: int) -> set[str]:
        return {m.content for m in window.conversation.messages[index:] if m.role == "user"}

    def send() -> None:
        text = f"t{rng.randrange(1, 90)} m{counter['sent']}"
        editing = window.messages.editing
        removed = texts_from(editing) if editing is not None else set()
        window.composer.setPlainText(text)
        window.send_button.click()
        if window.controller.engine is None and window.controller.loading and not window.controller.session.busy:  # sent once the models are there
            if rng.random() < 0.5:
                qtbot.keyClick(window.composer, Qt.Key_Escape)  # or not: it stays in the box
                return
            qtbot.waitUntil(lambda: window.controller.engine is not None or not window.controller.loading, timeout=20_000)
        if window.controller.session.busy and any(m.content == text for m in window.conversation.messages):
            kept.difference_update(removed)
            kept.add(text)
            counter["sent"] += 1

    def edit() -> None:
        users = [i for i, m in enumerate(window.conversation.messages) if m.role == "user"]
        if users and not window.controller.session.busy:
            window.messages.on_message_action("edit", rng.choice(users), 0)
            if rng.random() < 0.7:
                send()
            else:
                window.messages.cancel_edit()

    def delete() -> None:
        if window.delete_button.isEnabled() and window.conversation.id is not None:
            removed = texts_from(0)
            window.delete_button.click()
            kept.difference_update(removed)

    def click(button):
        return lambda: button.isEnabled() and button.click()

    def switch_draft() -> None:
        combo = window.controls.draft
        if combo.isEnabled():
            combo.setCurrentIndex(rng.randrange(combo.count()))

    def open_chat() -> None:
        if window.chat_list.isEnabled() and window.chat_list.count():
            window.open_chat(window.chat_list.item(rng.randrange(window.chat_list.count())).data(0x0100))

    def flip() -> None:
        window.messages.flip_version(rng.choice([-1, 1]))

    def toggle_speculation() -> None:
        window.controls.speculative.setChecked(not window.controls.speculative.isChecked())

    actions = [
        (send, 6), (click(window.stop_button), 2), (click(window.regenerate_button), 3), (edit, 2),
        (switch_draft, 1), (toggle_speculation, 1), (lambda: window.controls.k.setValue(rng.randrange(1, 17)), 1),
        (lambda: window.controls.adaptive.setChecked(rng.random() < 0.5), 1), (click(window.compare_button), 2),
        (click(window.new_button), 1), (open_chat, 2), (delete, 1), (flip, 1),
    ]
    functions, weights = zip(*actions)
    for _ in range(ACTIONS):
        rng.choices(functions, weights)[0]()
        qtbot.wait(rng.choice([0, 0, 5, 20, 60]))
        if window.controller.engine is None and rng.random() < 0.3:  # a model switch: let it load sometimes
            qtbot.waitUntil(lambda: window.controller.engine is not None or window.controls.draft.isEnabled(), timeout=20_000)

    window.stop()
    qtbot.waitUntil(lambda: not window.controller.session.busy, timeout=30_000)
    assert counter["sent"] >= 10  # the monkey really chatted (how many depends on timing: about 20)


    store = ChatStore(window.store.path)
    stored = {chat_id: store.load_chat(chat_id) for chat_id, _, _ in store.list_chats()}
    stored_user_texts = {m.content for chat in stored.values() for m in chat.messages if m.role == "user"}
    assert stored_user_texts == kept  # nothing lost, nothing resurrected
    if window.conversation.id is not None:
        saved = stored[window.conversation.id].messages
        assert [(m.role, m.content, m.shown, len(m.versions)) for m in saved] == \
               [(m.role, m.content, m.shown, len(m.versions)) for m in window.conversation.messages]
    for chat in stored.values():
        for message in chat.messages:
            if message.role == "assistant":
                assert message.stats.finish is not None and message.content == "".join(t.text for t in message.tokens)
    versions = sum(len(m.versions) > 1 for chat in stored.values() for m in chat.messages)
    compared = sum(bool(m.stats and m.stats.comparison) for chat in stored.values() for m in chat.messages)
    print(f"monkey: {ACTIONS} actions, {counter['sent']} messages sent, {len(kept)} kept, {len(stored)} chats, "
          f"{versions} regenerated answers, {compared} compared")
