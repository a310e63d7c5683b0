"""The window's Models dialog against the stand-in hub (tests/hub_standin.py) with the real
huggingface_hub client: a search lists files with sizes and fit, a download shows its progress, is
cancelled and resumes, the fetched GGUFs load as target and draft and chat, and *Find the best
draft* measures the drafts that pair with the target and offers *Use this pair*."""
import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMessageBox

from app.chat.store import ChatStore
from app.engine.api import LOOKUP, ProposerKind
from app.engine.errors import ModelError
from app.ui.main_window import MainWindow
from app.ui.models_dialog import DRAFTS_TAB
from tests.hub_standin import Hub, Repo, chat_gguf
from tests.test_gui import send_and_wait
from tests.tiny import tiny_model

pytest.importorskip("pytestqt")
TARGET_FILE, DRAFT_FILE = "tiny-chat-1.5B-Q8_0.gguf", "tiny-chat-0.5B-Q8_0.gguf"
TARGET_REPO, DRAFT_REPO = "tiny/Tiny-Chat-1.5B-GGUF", "tiny/Tiny-Chat-0.5B-GGUF"


@pytest.fixture(scope="module")
def chat_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat-ggufs")
    return (chat_gguf(folder / TARGET_FILE, seed=1, layers=3).read_bytes(),
            chat_gguf(folder / DRAFT_FILE, seed=1, layers=1, width=128, inner=256).read_bytes())


@pytest.fixture
def hub(tmp_path, monkeypatch, chat_files):
    from app.engine import draft_finder
    from app.engine.models import prepared_copies

    stand_in = Hub({TARGET_REPO: Repo({TARGET_FILE: chat_files[0], "README.md": b"# tiny"}),
                    DRAFT_REPO: Repo({DRAFT_FILE: chat_files[1]})})
    monkeypatch.setenv("HF_ENDPOINT", stand_in.start())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(prepared_copies, "folder", lambda: tmp_path / "prepared")  # (the kernel's build stays shared)
    monkeypatch.setattr(draft_finder, "results_path", lambda: tmp_path / "draft_ranks.json")
    yield stand_in
    stand_in.stop()


@pytest.fixture
def window(qtbot, tmp_path):
    from app.engine.models.loading import load_model

    tiny = {"default-target": tiny_model(seed=1), "default-draft": tiny_model(seed=1)}

    def load(source, device, dtype, report, **options):
        """The default pair as tiny models; a fetched file as it is (the real loader)."""
        if source in tiny:
            return tiny[source]
        if not source.endswith(".gguf"):
            raise ModelError(f"not found: {source}")
        return load_model(source, device, dtype, report, **options)

    config = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    config.setValue("max_new_tokens", 16)
    made = MainWindow(ChatStore(tmp_path / "chats.sqlite3"), config, load=load)
    qtbot.addWidget(made)
    made.show()
    qtbot.waitUntil(lambda: made.controller.engine is not None, timeout=10_000)
    yield made
    made.controller.stop()
    qtbot.waitUntil(lambda: not made.controller.session.busy, timeout=10_000)


def fetch(qtbot, dialog, row: int) -> str:
    """Downloads the first file of the row-th repository found; its source."""
    dialog.found.setCurrentItem(dialog.found.topLevelItem(row).child(0))
    dialog.download.click()
    qtbot.waitUntil(lambda: not dialog.library.pulling, timeout=30_000)
    assert dialog.progress_state.text().startswith("Ready: "), dialog.progress_state.text()
    return dialog.fetched


def test_a_model_fetched_in_the_window_chats_and_the_best_draft_is_found(qtbot, hub, window, monkeypatch):
    dialog = window.models.show_models()
    dialog.query.setText("tiny-chat")
    dialog.search_button.click()
    qtbot.waitUntil(lambda: dialog.found.topLevelItemCount() == 2, timeout=20_000)
    target_row = next(i for i in range(2) if dialog.found.topLevelItem(i).text(0).startswith(TARGET_REPO))
    listed = dialog.found.topLevelItem(target_row).child(0)
    assert [listed.text(c) for c in (0, 1, 3, 4)] == [TARGET_FILE, "Q8_0", "fits", ""]  # (README.md is no model)
    assert listed.text(2).endswith("MB")

    # a slow download cancelled once its progress shows, then resumed where it stopped
    hub.throttle = 0.03
    dialog.found.setCurrentItem(listed)
    dialog.download.click()
    qtbot.waitUntil(lambda: " of " in dialog.progress_state.text(), timeout=20_000)
    assert "/s" in dialog.progress_state.text() and "left" in dialog.progress_state.text()
    assert dialog.cancel.isEnabled() and not dialog.download.isEnabled()
    dialog.cancel.click()
    qtbot.waitUntil(lambda: not dialog.library.pulling, timeout=20_000)
    assert dialog.progress_state.text().startswith("Cancelled")
    assert dialog.local.topLevelItem(0).text(2)  # the unfinished download, on this machine
    hub.throttle = 0.0
    target = fetch(qtbot, dialog, target_row)
    assert any(int(r.removeprefix("bytes=").rstrip("-")) > 0 for r in hub.ranges)  # continued, not restarted
    assert listed.text(4) == "yes"

    # the fetched file as the target: the default draft's vocabulary is refused with its reason
    dialog.as_target.click()
    qtbot.waitUntil(lambda: window.controller.engine is not None and window.controller.engine.target.name == TARGET_FILE,
                    timeout=60_000)
    # the drafts for it: the default draft refused with the reason, a smaller one of its family on the hub
    dialog.tabs.setCurrentIndex(DRAFTS_TAB)
    qtbot.waitUntil(lambda: dialog.drafts.rowCount() == 2, timeout=20_000)
    pairs = {dialog.drafts.item(r, 0).text(): dialog.drafts.item(r, 4).text() for r in range(2)}
    assert pairs["default-draft"].startswith("no: ") and "vocabulary" in pairs["default-draft"]
    on_hub = f"{DRAFT_REPO.split('/')[1]} ({DRAFT_FILE})"
    assert pairs[on_hub].startswith("on the hub") and "smaller tiny-chat models" in dialog.drafts_state.text()
    dialog.drafts.selectRow(next(r for r in range(2) if dialog.drafts.item(r, 0).text() == on_hub))
    dialog.fetch_draft.click()
    assert dialog.tabs.currentIndex() == 0
    qtbot.waitUntil(lambda: not dialog.library.pulling, timeout=30_000)
    draft = dialog.fetched
    assert draft.endswith(DRAFT_FILE)
    dialog.as_draft.click()
    qtbot.waitUntil(lambda: window.controller.engine is not None and window.controller.engine.draft is not None
                    and window.controller.engine.draft.name == DRAFT_FILE, timeout=60_000)
    answer = send_and_wait(qtbot, window, "hello there")
    assert answer.role == "assistant" and answer.tokens

    # Find the best draft: the drafts checked against the target, then each compatible one measured
    window.controls.find_draft.click()
    assert dialog.tabs.currentIndex() == DRAFTS_TAB
    qtbot.waitUntil(lambda: dialog.ranking.rowCount() >= 2, timeout=120_000)
    pairs = {dialog.drafts.item(r, 0).text(): dialog.drafts.item(r, 4).text() for r in range(dialog.drafts.rowCount())}
    assert pairs[DRAFT_FILE] == "yes" and pairs["default-draft"].startswith("no: ")  # refused, with the reason
    ranked = {dialog.ranking.item(r, 1).text(): [dialog.ranking.item(r, c).text() for c in range(8)]
              for r in range(dialog.ranking.rowCount())}
    assert set(ranked) == {DRAFT_FILE, LOOKUP}
    assert all(row[2].endswith("x") and row[7] == "yes" for row in ranked.values())  # measured, identical
    assert dialog.use_pair.isEnabled() and dialog.rank_state.text().startswith("Best: ")
    assert "x measured)" in window.controls.draft.currentText()  # the picker shows what was measured

    lookup_row = next(r for r in range(dialog.ranking.rowCount()) if dialog.ranking.item(r, 1).text() == LOOKUP)
    dialog.ranking.selectRow(lookup_row)
    dialog.use_pair.click()
    assert window.controls.proposer.currentData() == ProposerKind.PROMPT_LOOKUP

    # deleted from disk: out of the pickers except the one in use, which is marked
    window.controls.proposer.setCurrentIndex(window.controls.proposer.findData(ProposerKind.DRAFT_MODEL))
    dialog.tabs.setCurrentIndex(1)
    draft_repo = next(i for i in range(dialog.local.topLevelItemCount())
                      if dialog.local.topLevelItem(i).text(0) == DRAFT_REPO)
    dialog.local.setCurrentItem(dialog.local.topLevelItem(draft_repo))
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *args, **kwargs: QMessageBox.Yes))
    dialog.delete_local.click()
    assert "freed" in dialog.local_state.text() and dialog.local.topLevelItemCount() == 1
    assert "file not found" in window.controls.draft.currentText()
    assert window.controls.target.findData(target) >= 0 and window.controls.draft.findData(draft) >= 0

    # out of the pickers without deleting: the target in use stays chosen, the draft picker lets it go
    dialog.local.setCurrentItem(dialog.local.topLevelItem(0))
    dialog.remove_local.click()
    assert window.controls.target_source() == target and window.controls.draft.findData(target) < 0
    assert target not in window.settings.value("extra_models", [], list)
    dialog.local.setCurrentItem(dialog.local.topLevelItem(0))
    dialog.add_local.click()
    assert window.controls.draft.findData(target) >= 0

