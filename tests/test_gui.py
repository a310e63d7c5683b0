"""Layer 5: the GUI with pytest-qt, offscreen, on tiny models (real engine, tiny weights)."""

import asyncio
import json
import threading

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QMessageBox, QPushButton

from app.chat.store import ChatStore
from app.engine.steps import FinishReason
from app.engine.engine import GenerationOptions, ProposerKind, SpeculativeEngine
from app.engine.errors import ModelError
from app.engine.sampling import SamplingParams
from app.engine.api import CHAT_DEFAULTS
from app.ui.main_window import READ_AHEAD_AFTER_MS, MainWindow
from app.ui.theme import LIGHT
from tests.helpers import EMPTY_GGUF
from tests.tiny import tiny_model

pytest.importorskip("pytestqt")


@pytest.fixture
def tiny_models():
    target = tiny_model(seed=1)
    return {"default-target": target, "default-draft": tiny_model(seed=1),  # same weights: accepted
            "other-draft": tiny_model(seed=2), "foreign-draft": tiny_model(seed=3, vocab_size=64, prefix="w")}


@pytest.fixture
def make_window(qtbot, tmp_path, tiny_models):
    windows = []

    holds = []  # events a load waits for

    def load(source, device, dtype, report, **_):
        for hold in holds:
            hold.wait(10)
        if source not in tiny_models:
            raise ModelError(f"GGUF file not found: {source}")
        return tiny_models[source]

    def make(saved_caches=None, hold=None, **settings):
        """hold: the models load once this event is set (the window is returned meanwhile)."""
        holds[:] = [hold] if hold is not None else []
        config = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
        for key, value in {"max_new_tokens": 24, "extra_models": ["other-draft"], **settings}.items():
            config.setValue(key, value)
        window = MainWindow(ChatStore(tmp_path / "chats.sqlite3"), config, load=load, saved_caches=saved_caches)
        qtbot.addWidget(window)
        window.show()
        # (A waitSignal blocker entered and never exited stayed connected after it was collected,
        # and Qt then called into freed memory: a rare segfault during garbage collection.)
        if hold is None:
            qtbot.waitUntil(lambda: window.controller.engine is not None, timeout=10_000)
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.controller.stop()
        qtbot.waitUntil(lambda: not window.controller.session.busy, timeout=10_000)


def send_and_wait(qtbot, window, text="hello there"):
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.composer.setPlainText(text)
        window.send_button.click()
    return window.conversation.messages[-1]


def close_window(window):
    """Closes the window as its close button does, and waits for the caches it saves on a thread."""
    window.close()
    if window.controller.closing is not None:
        window.controller.closing.join(60)


def wait_until_streaming(qtbot, window):
    """Poll on the UI thread: the engine's steps are computed on a Python thread, and a test
    blocker connected to it directly would run there, racing the UI thread (a rare segfault)."""
    qtbot.waitUntil(lambda: window.controller.session.builder is not None and bool(window.controller.session.builder.tokens), timeout=10_000)


def token_fragments(window):
    """(href, colour name) of every token fragment in the chat view's document."""
    found = []
    block = window.chat_view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            href = fragment.charFormat().anchorHref()
            if href.startswith("tok:"):
                found.append((href, fragment.charFormat().foreground().color().name().lower()))
            it += 1
        block = block.next()
    return found


def test_chat_turn_streams_with_provenance_colours(qtbot, make_window):
    # fixed k: every step drafts, so no plain tokens; the same-model draft alone: no corrections
    window = make_window(k=3, adaptive=False, lookup=False)
    steps = []
    window.controller.step.connect(steps.append)
    answer = send_and_wait(qtbot, window)
    assert len(steps) > 1  # streamed step by step
    assert answer.role == "assistant" and answer.tokens
    sources = {t.source for t in answer.tokens}
    assert sources <= {"accepted", "bonus", "plain"} and "accepted" in sources  # (the first token is plain)
    fragments = token_fragments(window)
    assert fragments
    for href, colour in fragments:
        token = window.chat_view.token_at(href)
        assert colour == LIGHT.colour(token.source).lower()


def test_the_device_is_named_once_the_models_load(make_window):
    window = make_window()
    assert window.controls.device.text().startswith(("CPU", "CUDA"))
    assert window.controls.precision.isEnabled()


def test_on_a_gpu_the_cpus_precision_pickers_are_greyed_out_and_say_why(make_window, monkeypatch):
    """What torch would say of a GPU injected where the pool asks (the tiny models stay on the CPU)."""
    import torch

    from app.engine import devices

    monkeypatch.setattr(devices, "pick_device", lambda chosen="auto": (torch.device("cuda"), torch.bfloat16, "CUDA: RTX 4090 (bfloat16)"))
    controls = make_window().controls
    assert controls.device.text() == "CUDA: RTX 4090 (bfloat16)"
    for picker in (controls.precision, controls.draft_precision, controls.kv_cache):
        assert not picker.isEnabled() and picker.toolTip().startswith("The models run on the GPU")
    controls.show_device("CPU: chosen by SPECCHAT_DEVICE", False)
    assert controls.precision.isEnabled() and controls.precision.toolTip().startswith("CPU weights of the target")


OPENS_WINDOW = """
import os, sys, threading
os.environ["QT_QPA_PLATFORM"] = "offscreen"
class ImportedOnTheUIThread:  # a meta path finder that sees every import before it happens
    def find_spec(self, name, path=None, target=None):
        if name in ("torch", "transformers") and threading.current_thread() is threading.main_thread():
            sys.stderr.write(f"{name} imported on the UI thread\\n")
            os._exit(3)
sys.meta_path.insert(0, ImportedOnTheUIThread())
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication
from app.chat.store import ChatStore
from app.cli import build_parser
from app.engine.errors import ModelError
from app.ui.main_window import MainWindow
build_parser().parse_args([])  # python -m app's command line, as the window starts
app = QApplication([])
folder = sys.argv[1]
def load(*_, **__):
    raise ModelError("no models in this test")
window = MainWindow(ChatStore(folder + "/chats.sqlite3"), QSettings(folder + "/settings.ini", QSettings.IniFormat), load=load)
window.show()
timer = QTimer(interval=20)
timer.timeout.connect(lambda: window.last_error is not None and app.quit())  # the load said what failed
timer.start()
app.exec()
print(window.last_error, "torch" in sys.modules)  # torch was imported, on the loader's thread
"""


def test_the_window_opens_before_torch_is_imported(tmp_path):
    """torch and transformers take seconds to import (3 s here): the window's modules leave them to
    the models' load, on its thread, so the window shows at once and the models load behind it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", OPENS_WINDOW, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no models in this test True"


LEAVES = """
import atexit, sys, threading, time
from PySide6.QtCore import QSettings
from app.ui.app import leave_work_behind
settings = QSettings(sys.argv[1], QSettings.IniFormat)
settings.setValue("k", 5)
atexit.register(lambda: print("finalized"))
if sys.argv[2] == "loading":
    threading.Thread(target=time.sleep, args=(60,), name="specchat-load", daemon=True).start()
leave_work_behind(settings)
print("left as usual")
"""


@pytest.mark.parametrize("work, printed", [("loading", ""), ("idle", "left as usual\nfinalized")])
def test_an_exit_during_a_load_leaves_at_once_with_the_settings_saved(tmp_path, work, printed):
    """Closing the window while the models load ended in an abort ("terminate called without an
    active exception", exit status 134) as the interpreter tore the load down inside torch."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LEAVES, str(tmp_path / "settings.ini"), work], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, printed), done.stderr
    assert "k=5" in (tmp_path / "settings.ini").read_text()


def test_a_message_sent_while_the_models_load_goes_once_they_are_there(qtbot, make_window):
    hold = threading.Event()
    window = make_window(hold=hold)
    assert window.send_button.isEnabled()  # the window opens first: sending need not wait for the models
    window.composer.setPlainText("hello there")
    window.send_button.click()
    assert window.controller.engine is None and not window.conversation.messages
    assert "sent as soon as they are ready" in window.statusBar().currentMessage()
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        hold.set()
    assert [m.role for m in window.conversation.messages] == ["user", "assistant"]
    assert window.conversation.messages[0].content == "hello there" and not window.composer.toPlainText()


def test_esc_keeps_a_message_sent_while_the_models_load(qtbot, make_window):
    hold = threading.Event()
    window = make_window(hold=hold)
    window.composer.setPlainText("not yet")
    qtbot.keyClick(window.composer, Qt.Key_Return)
    qtbot.keyClick(window.composer, Qt.Key_Escape)
    hold.set()
    qtbot.waitUntil(lambda: window.controller.engine is not None, timeout=10_000)
    qtbot.wait(100)
    assert not window.conversation.messages and window.composer.toPlainText() == "not yet"


def test_corrections_are_coloured_and_explained(qtbot, make_window):
    window = make_window(draft="other-draft", k=3, adaptive=False)  # the policy may rightly decode plainly
    answer = send_and_wait(qtbot, window)
    corrected = [t for t in answer.tokens if t.source == "corrected"]
    assert corrected and all(t.replaced is not None for t in corrected)
    colours = {colour for _, colour in token_fragments(window)}
    assert LIGHT.corrected.lower() in colours
    from app.ui.chat_view import token_tooltip
    assert "replaced draft token" in token_tooltip(corrected[0])


def test_copied_tokens_say_so(qtbot, make_window):
    """With copying on, the tooltip of a copied token and the acceptance view say what was copied."""
    from app.ui.chat_view import token_tooltip
    window = make_window(k=3, adaptive=False, lookup=True, max_new_tokens=64)
    answer = send_and_wait(qtbot, window, "one two three four five one two three four five one two three")
    copied = [t for t in answer.tokens if t.copied]
    assert copied and answer.stats.looked_up >= len([t for t in copied if t.source == "accepted"])
    assert all(t.p_draft is None for t in copied if t.source == "accepted")
    assert "copied from earlier text" in token_tooltip(copied[0])
    assert f"{answer.stats.looked_up} copied" in window.acceptance.fields["acceptance"].text()


def test_speculation_off_gives_only_plain_tokens(qtbot, make_window):
    window = make_window()
    window.controls.speculative.setChecked(False)
    answer = send_and_wait(qtbot, window)
    assert {t.source for t in answer.tokens} == {"plain"}
    assert answer.stats.mode == "plain" and answer.stats.drafted == 0


@pytest.fixture
def seen(monkeypatch):
    """The options of every request the engine gets."""
    requests = []
    original = SpeculativeEngine.generate
    monkeypatch.setattr(SpeculativeEngine, "generate",
                        lambda self, ids, options, cancel=None: requests.append(options) or original(self, ids, options, cancel))
    return requests


def test_k_and_adaptive_reach_the_engine(qtbot, make_window, seen):
    window = make_window()
    window.controls.adaptive.setChecked(False)
    window.controls.k.setValue(7)
    window.controls.lookup.setChecked(False)
    answer = send_and_wait(qtbot, window)
    assert seen[-1].k == 7 and not seen[-1].adaptive and seen[-1].lookup == 0
    assert max(answer.stats.accepted_lengths) <= 7
    window.controls.adaptive.setChecked(True)
    window.controls.k.setValue(1)
    window.controls.lookup.setChecked(True)
    send_and_wait(qtbot, window, "once more")
    assert seen[-1].lookup == GenerationOptions().lookup > 0
    window.controls.proposer.setCurrentIndex(window.controls.proposer.findData(ProposerKind.PROMPT_LOOKUP))
    assert not window.controls.lookup.isEnabled()  # prompt lookup has no draft model to spare
    send_and_wait(qtbot, window, "again")
    assert seen[-1].adaptive and seen[-1].k == 1 and seen[-1].proposer is ProposerKind.PROMPT_LOOKUP


def test_sampling_filters_reach_the_engine_and_are_remembered(qtbot, make_window, seen):
    window = make_window()
    assert not window.controls.min_p.isEnabled()  # greedy by default: the filters do nothing
    assert window.controls.repeat_penalty.isEnabled()  # but a repeat penalty does
    send_and_wait(qtbot, window)
    assert seen[-1].sampling == CHAT_DEFAULTS.sampling != SamplingParams()
    chosen = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.25)
    for control, value in (("temperature", 0.8), ("top_k", 40), ("top_p", 0.9), ("min_p", 0.05),
                           ("repeat_penalty", 1.25)):
        getattr(window.controls, control).setValue(value)
    assert window.controls.min_p.isEnabled()
    send_and_wait(qtbot, window)
    assert seen[-1].sampling == chosen
    window.controls.min_p.setValue(0.0)
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.compare_button.click()
    assert seen[-1].sampling == chosen and not seen[-1].speculative  # the answer's own settings
    window.controls.min_p.setValue(0.05)
    window.save_settings()
    assert make_window().controls.generation_options().sampling == chosen


def test_the_kv_cache_picker_reloads_the_engine_and_is_remembered(qtbot, make_window, tiny_models):
    """Models > KV cache: float32 rebuilds the engine on the loaded models with float32 caches (the
    memory line says so); the choice survives a restart."""
    import torch

    from app.engine.lowbit import kernel
    from app.engine.lowbit.modules import quantize_model
    from app.engine.models.loading import LoadedModel

    if kernel.native() is None:
        pytest.skip("the C++ kernel is not built on this machine: the Python loop's cache is float32")
    tiny = tiny_model(seed=1, hidden=64)
    lowbit = LoadedModel("tiny low-bit", quantize_model(tiny.model, 4), tiny.tokenizer)
    tiny_models["default-target"] = tiny_models["default-draft"] = lowbit
    window = make_window()
    assert window.controller.engine.kv_cache == torch.float16
    with qtbot.waitSignal(window.models_ready, timeout=10_000):
        window.controls.kv_cache.setCurrentIndex(window.controls.kv_cache.findData("float32"))
    assert window.controller.engine.kv_cache == torch.float32
    send_and_wait(qtbot, window)
    assert "(float32)" in window.acceptance.fields["memory"].text()
    window.save_settings()
    assert make_window().controller.engine.kv_cache == torch.float32


def test_stop_cancels_generation(qtbot, make_window):
    window = make_window(max_new_tokens=5000)
    window.composer.setPlainText("go on forever")
    window.send_button.click()
    wait_until_streaming(qtbot, window)
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.stop_button.click()
    answer = window.conversation.messages[-1]
    assert answer.stats.finish is FinishReason.CANCELLED
    assert answer.stats.emitted < 5000


def test_a_draft_of_another_vocabulary_leaves_the_target_speculating_by_prompt_lookup(qtbot, make_window):
    """A draft whose vocabulary differs from the target's is named and marked; the target runs
    alone, speculating by prompt lookup (its own greedy output), rather than not at all."""
    window = make_window()
    window.controls.add_source("foreign", "foreign-draft")
    # (waitUntil, not a waitSignal on `loaded`: a reload emits it again after the blocker is gone,
    # and a stale blocker's slot had been called then: "no attribute check_params_callback")
    window.controls.draft.setCurrentIndex(window.controls.draft.findData("foreign-draft"))
    qtbot.waitUntil(lambda: window.last_error is not None, timeout=10_000)
    assert "do not share a vocabulary" in window.last_error and "64 tokens" in window.last_error
    assert "runs alone, speculating by prompt lookup" in window.last_error and ". Meanwhile" in window.last_error
    index = window.controls.draft.findData("foreign-draft")
    assert window.controls.draft.itemText(index).endswith("(different vocabulary)")
    assert window.controls.draft_source() == "foreign-draft" and window.controller.engine.draft is None
    assert "no draft model" in window.acceptance.fields["memory"].text()
    answer = send_and_wait(qtbot, window)
    assert answer.stats.mode.startswith("speculative (prompt lookup")
    window.new_chat()
    window.controls.speculative.setChecked(False)
    assert send_and_wait(qtbot, window).stats.token_ids == answer.stats.token_ids  # the target's own output


def test_a_target_of_another_family_loads_beside_the_chosen_draft(qtbot, make_window):
    """Choosing a target whose vocabulary the draft does not share (a Llama file beside the default
    Qwen draft) loads the target alone instead of going back to the last pair; back on a target of
    the draft's family, the mark goes and the draft drafts again."""
    window = make_window(extra_models=["other-draft", "foreign-draft"])
    target = window.controls.target
    target.setCurrentIndex(target.findData("foreign-draft"))  # a 64-token model as the target
    qtbot.waitUntil(lambda: window.last_error is not None, timeout=10_000)
    assert window.controls.target_source() == "foreign-draft" and window.controller.engine.target.name == "tiny-3"
    assert window.controller.engine.draft is None
    draft = window.controls.draft
    assert draft.itemText(draft.findData("default-draft")).endswith("(different vocabulary)")
    target.setCurrentIndex(target.findData("default-target"))
    qtbot.waitUntil(lambda: window.controller.engine is not None and window.controller.engine.draft is not None, timeout=10_000)
    assert not any(draft.itemText(i).endswith("(different vocabulary)") for i in range(draft.count()))
    assert draft.model().item(draft.findData("default-draft")).isEnabled()


def test_a_missing_model_file_is_a_message_and_does_not_blame_the_draft(qtbot, make_window):
    window = make_window(draft="other-draft")
    window.controls.add_source("gone", "missing-target")  # not in tiny_models: the loader raises
    window.controls.target.setCurrentIndex(window.controls.target.findData("missing-target"))
    qtbot.waitUntil(lambda: window.last_error is not None, timeout=10_000)  # as above
    assert "missing-target" in window.last_error
    assert not any(window.controls.draft.itemText(i).endswith("(different vocabulary)")
                   for i in range(window.controls.draft.count()))
    # back to the pair that worked, loaded again; the settings keep it for the next start
    assert (window.controls.target_source(), window.controls.draft_source()) == ("default-target", "other-draft")
    qtbot.waitUntil(lambda: window.controller.engine is not None, timeout=10_000)
    assert window.controller.engine.draft.name == "tiny-2"
    window.save_settings()
    assert make_window().controls.target_source() == "default-target"


def test_a_saved_choice_that_no_longer_loads_falls_back_to_the_default_pair(qtbot, make_window):
    """A target saved at the last exit whose file is gone: the start names it and loads the
    default pair instead of leaving the window without models."""
    window = make_window(target="missing-target", extra_models=["other-draft", "missing-target"])
    assert "missing-target" in window.last_error
    assert window.controls.target_source() == "default-target" and window.controller.engine is not None


def test_a_saved_model_whose_file_is_gone_is_marked_in_the_pickers(qtbot, make_window, tmp_path):
    """A model added in an earlier run whose file has since been deleted stays listed (a drive may
    be back later), marked, with the reason in its tooltip."""
    gone = str(tmp_path / "deleted.gguf")
    window = make_window(extra_models=["other-draft", gone])
    for combo in (window.controls.target, window.controls.draft):
        index = combo.findData(gone)
        assert combo.itemText(index) == "deleted.gguf  (file not found)"
        assert "No such file or folder" in combo.itemData(index, Qt.ToolTipRole)
    assert window.controls.draft.itemText(window.controls.draft.findData("other-draft")) == "other-draft"
    (tmp_path / "deleted.gguf").write_bytes(EMPTY_GGUF)  # the file is back and added again
    window.models.add_model_source(gone)
    assert window.controls.target.itemText(window.controls.target.findData(gone)) == "deleted.gguf"
    # a GGUF without a tokenizer: marked so, not blamed on the vocabulary, and still offered
    draft = window.controls.draft
    qtbot.waitUntil(lambda: draft.itemText(draft.findData(gone)).endswith("(cannot be read)"), timeout=20_000)
    for combo in (window.controls.target, window.controls.draft):
        index = combo.findData(gone)
        assert combo.itemText(index) == "deleted.gguf  (cannot be read)"
        assert "Cannot read the tokenizer" in combo.itemData(index, Qt.ToolTipRole)
        assert combo.model().item(index).isEnabled()


def test_saved_chat_reloads_with_colours_after_restart(qtbot, make_window):
    # fixed k: the cost-aware policy may rightly decode a short answer of the tiny models plainly
    window = make_window(draft="other-draft", k=3, adaptive=False)
    answer = send_and_wait(qtbot, window)
    chat_id = window.conversation.id
    close_window(window)
    again = make_window()
    assert again.chat_list.count() == 1
    again.open_chat(chat_id)
    reloaded = again.conversation.messages[-1]
    assert [(t.text, t.source) for t in reloaded.tokens] == [(t.text, t.source) for t in answer.tokens]
    colours = {colour for _, colour in token_fragments(again)}
    assert {LIGHT.accepted.lower(), LIGHT.corrected.lower()} & colours


def chat_saved_at_close(qtbot, make_window, saved):
    """A chat of 80 words answered, its window closed: the models' caches saved under `saved`."""
    window = make_window(saved_caches=saved)
    send_and_wait(qtbot, window, " ".join(f"t{i % 90 + 1}" for i in range(80)))
    close_window(window)
    assert list(saved.rglob("*.pt"))
    return window.conversation.id


def test_a_chat_reopened_after_a_restart_is_not_read_again(qtbot, make_window, tmp_path, monkeypatch):
    """Closing the window saves the models' caches; the next run's follow-up in the reopened chat
    finds the conversation cached. Deleting the chat deletes the copies."""
    saved = tmp_path / "saved-caches"
    chat_id = chat_saved_at_close(qtbot, make_window, saved)
    again = make_window(saved_caches=saved)
    again.open_chat(chat_id)
    follow_up = send_and_wait(qtbot, again, "t7 t8")
    assert follow_up.stats.cached_prompt_tokens >= 64
    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.Yes)
    again.delete_chat()
    qtbot.waitUntil(lambda: not list(saved.rglob("*.pt")), timeout=10_000)


def test_a_chat_deleted_while_the_models_are_busy_does_not_block_the_window_and_its_copies_go_later(
        qtbot, make_window, tmp_path, monkeypatch):
    """The models' lock held as a request holds it: deleting the chat returns at once (the
    window and the API's streams share its loop), and the chat's copies go once the models are
    free, before the caches are saved at close."""
    saved = tmp_path / "saved-caches"
    window = make_window(saved_caches=saved)
    send_and_wait(qtbot, window, " ".join(f"t{i % 90 + 1}" for i in range(80)))
    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.Yes)
    busy = window.controller.engine._busy
    busy.acquire()
    try:
        window.delete_chat()  # returns while the models are still held
        assert window.chat_list.count() == 0
        window.close()  # so does closing: the caches are saved on a thread of their own
        assert window.controller.closing.is_alive()
    finally:
        busy.release()
    window.controller.closing.join(60)
    assert not window.controller.closing.is_alive()
    assert not list(saved.rglob("*.pt"))  # the deleted chat was forgotten first


def test_a_chat_deleted_while_the_models_load_loses_its_saved_copies_once_they_are_there(
        qtbot, make_window, tmp_path, monkeypatch):
    """The window opens before the models are loaded: a chat deleted meanwhile cannot yet be told
    apart in the saved copies (they hold no text); they go as soon as the models can tell."""
    saved = tmp_path / "saved-caches"
    chat_id = chat_saved_at_close(qtbot, make_window, saved)
    hold = threading.Event()
    again = make_window(saved_caches=saved, hold=hold)
    again.open_chat(chat_id)
    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.Yes)
    again.delete_chat()
    assert again.controller.engine is None and again.chat_list.count() == 0
    hold.set()
    qtbot.waitUntil(lambda: again.controller.engine is not None, timeout=10_000)
    qtbot.waitUntil(lambda: not list(saved.rglob("*.pt")), timeout=10_000)


def test_switching_models_saves_the_caches_of_those_left(qtbot, make_window, tmp_path):
    saved = tmp_path / "saved-caches"
    window = make_window(saved_caches=saved)
    send_and_wait(qtbot, window, " ".join(f"t{i % 90 + 1}" for i in range(80)))
    with qtbot.waitSignal(window.models_ready, timeout=10_000):
        window.controls.draft.setCurrentIndex(window.controls.draft.findData("other-draft"))
    assert window.controller.engine is not None and list(saved.rglob("*.pt"))


def test_compare_reports_identical_greedy_texts(qtbot, make_window):
    window = make_window(draft="other-draft")
    send_and_wait(qtbot, window)
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.compare_button.click()
    assert "identical" in window.acceptance.comparison.text()
    assert len([m for m in window.conversation.messages if m.role == "assistant"]) == 1
    # the result is a card under the answer it compared, and saved with the chat
    assert "Compare: speculative" in window.chat_view.toPlainText()
    saved = ChatStore(window.store.path).load_chat(window.conversation.id).messages[-1]
    assert saved.stats.comparison.identical and saved.stats.comparison.plain_tokens_per_s > 0
    assert window.acceptance.fields["mode"].text().startswith("speculative")  # still the compared run


def test_closing_during_generation_keeps_the_partial_answer(qtbot, make_window, tmp_path):
    window = make_window(max_new_tokens=5000)
    window.composer.setPlainText("long answer please")
    window.send_button.click()
    wait_until_streaming(qtbot, window)
    close_window(window)
    store = ChatStore(tmp_path / "chats.sqlite3")
    saved = store.load_chat(window.conversation.id).messages
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[-1].stats.finish is FinishReason.INTERRUPTED and saved[-1].tokens


def test_added_model_with_another_vocabulary_is_flagged(qtbot, make_window, tmp_path):
    window = make_window()
    foreign = tiny_model(seed=3, vocab_size=64, prefix="w")
    folder = str(tmp_path / "foreign")
    foreign.model.save_pretrained(folder)
    foreign.tokenizer.save_pretrained(folder)
    window.models.add_model_source(folder)
    index = window.controls.draft.findData(folder)
    qtbot.waitUntil(lambda: window.controls.draft.itemText(index).endswith("(different vocabulary)"), timeout=20_000)
    assert "do not share a vocabulary" in window.controls.draft.itemData(index, Qt.ToolTipRole)


def test_acceptance_view_stays_in_sight_at_1280x800(qtbot, make_window):
    window = make_window()
    window.resize(1280, 800)
    send_and_wait(qtbot, window)
    assert (window.width(), window.height()) == (1280, 800)  # the layout's minimum fits
    view = window.acceptance
    for widget in (view.histogram, view.trace, view.context, view.fields["speed"], view.comparison):
        assert widget.isVisible() and widget.visibleRegion().boundingRect() == widget.rect(), widget
    assert view.context.value() > 0 and "tokens" in view.context.format()
    assert view.fields["first"].text().endswith(" s")


def test_regenerate_keeps_versions_to_flip_between(qtbot, make_window):
    window = make_window(max_new_tokens=12)
    first = send_and_wait(qtbot, window)
    window.controls.speculative.setChecked(False)  # each version keeps its own settings and stats
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.regenerate_button.click()
    answer = window.conversation.messages[-1]
    assert len(window.conversation.messages) == 2 and len(answer.versions) == 2 and answer.shown == 1
    assert answer.stats.mode == "plain" and answer.versions[0].stats.mode.startswith("speculative")
    assert "2/2" in window.chat_view.toPlainText()
    window.messages.on_message_action("version", 1, 0)
    assert answer.shown == 0 and answer.content == first.content and "1/2" in window.chat_view.toPlainText()
    saved = ChatStore(window.store.path).load_chat(window.conversation.id).messages[-1]
    assert saved.shown == 0 and [v.stats.mode for v in saved.versions] == [v.stats.mode for v in answer.versions]


def test_edit_and_resend_continues_from_the_edited_message(qtbot, make_window):
    window = make_window(max_new_tokens=8)
    send_and_wait(qtbot, window, "t1 t2")
    send_and_wait(qtbot, window, "t3 t4")
    window.messages.on_message_action("edit", 0, 0)
    assert window.composer.toPlainText() == "t1 t2" and window.edit_banner.isVisibleTo(window)
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.composer.setPlainText("t9 t9")
        window.send_button.click()
    roles = [(m.role, m.content if m.role == "user" else "") for m in window.conversation.messages]
    assert roles == [("user", "t9 t9"), ("assistant", "")]
    saved = ChatStore(window.store.path).load_chat(window.conversation.id).messages
    assert [m.content for m in saved] == [m.content for m in window.conversation.messages]


def test_a_question_left_unanswered_can_be_answered(qtbot, make_window, tmp_path):
    from app.chat.conversation import Conversation, Message

    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = Conversation(title="killed before the answer")
    store.add_message(chat, Message("user", "t5 t6"))
    window = make_window()
    window.open_chat(chat.id)
    assert "No answer yet" in window.chat_view.toPlainText()
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.messages.on_message_action("answer", 0, 0)
    assert [m.role for m in window.conversation.messages] == ["user", "assistant"]
    assert "No answer yet" not in window.chat_view.toPlainText()


def test_copy_message_and_code_block(qtbot, make_window):
    from PySide6.QtWidgets import QApplication

    from app.chat.conversation import Message

    window = make_window()
    window.conversation.messages.append(Message("user", "Show code:\n```python\nprint(1)\n```\nthanks"))
    window.chat_view.show_messages(window.conversation.messages)
    window.messages.on_message_action("copy", 0, 0)
    assert QApplication.clipboard().text() == window.conversation.messages[0].content
    window.messages.on_message_action("copycode", 0, 0)
    assert QApplication.clipboard().text() == "print(1)\n"
    # an answer is copied without a reasoning model's thinking, unless it is all there is so far
    window.conversation.messages.append(Message("assistant", "<think>\nTwo twos.\n</think>\n\n2 × 2 = **4**."))
    window.messages.on_message_action("copy", 1, 0)
    assert QApplication.clipboard().text() == "2 × 2 = **4**."
    window.conversation.messages.append(Message("user", "again"))
    window.conversation.messages.append(Message("assistant", "<think>\nStill thinking"))
    window.messages.on_message_action("copy", 3, 0)
    assert QApplication.clipboard().text() == "<think>\nStill thinking"


def test_system_prompt_reaches_the_model_and_is_saved(qtbot, make_window):
    window = make_window(system_prompt="t7 t7 t7")
    assert window.conversation.system_prompt == "t7 t7 t7"  # the default from settings
    send_and_wait(qtbot, window, "t1")
    window.controller.session.set_system_prompt("t8")
    assert window.conversation.prompt_messages()[0] == {"role": "system", "content": "t8"}
    assert ChatStore(window.store.path).load_chat(window.conversation.id).system_prompt == "t8"


def test_selection_survives_while_an_answer_streams(qtbot, make_window):
    from PySide6.QtGui import QTextCursor

    window = make_window(max_new_tokens=8)
    send_and_wait(qtbot, window, "t1 t2 t3")
    window.controls.max_new_tokens.setValue(200)
    window.composer.setPlainText("t4")
    window.send_button.click()
    wait_until_streaming(qtbot, window)
    cursor = window.chat_view.textCursor()
    cursor.setPosition(0)
    cursor.setPosition(5, QTextCursor.KeepAnchor)  # "You  " of the first message
    window.chat_view.setTextCursor(cursor)
    selected = window.chat_view.textCursor().selectedText()
    tokens_then = len(window.controller.session.builder.tokens)
    qtbot.waitUntil(lambda: window.controller.session.builder is None or len(window.controller.session.builder.tokens) > tokens_then + 20,
                    timeout=20_000)
    assert window.chat_view.textCursor().selectedText() == selected and selected
    window.stop()
    qtbot.waitUntil(lambda: not window.controller.session.busy, timeout=20_000)


def test_a_streamed_answer_ending_in_a_list_keeps_its_header_a_paragraph(qtbot):
    """Finishing a streamed answer rewrites it in place; its header must come out as a full
    render makes it (its margins, in no list), not as an item of the list the answer ended in."""
    from app.chat.conversation import AnswerStats, Message, TokenRecord
    from app.engine.steps import Source
    from app.ui.chat_view import ChatView
    from app.ui.token_html import RenderOptions

    def answer(pieces: list[str]) -> Message:
        tokens = [TokenRecord(piece, Source.ACCEPTED, 0.9) for piece in pieces]
        return Message("assistant", "".join(pieces), tokens, AnswerStats(mode="speculative"))

    def headers(view: ChatView) -> list[tuple]:
        block, found = view.document().begin(), []
        while block.isValid():
            if block.text().startswith("Assistant"):
                found.append((block.textList() is None, block.blockFormat().topMargin()))
            block = block.next()
        return found

    view = ChatView(RenderOptions(LIGHT))
    qtbot.addWidget(view)
    before = [Message("user", "q"), answer(["391"]), Message("user", "explain")]
    pieces = ["Steps:\n\n", "1. First", " step\n", "2. Second", " step\n"]
    view.show_messages(before, answer_follows=True)
    for n in range(1, len(pieces) + 1):
        view.stream(before, answer(pieces[:n]))
    view.finish(before + [answer(pieces)])
    finished = headers(view)
    view.show_messages(before + [answer(pieces)])
    assert finished == headers(view) and all(not_listed for not_listed, _ in finished)


def test_a_thinking_answer_streams_as_it_renders_whole(qtbot):
    """A reasoning model's thinking streams into its indented block part by part (its paragraphs
    close one by one) and reads as the finished answer's render, markers left out."""
    from app.chat.conversation import Message, TokenRecord
    from app.engine.steps import Source
    from app.ui.chat_view import ChatView
    from app.ui.token_html import RenderOptions

    pieces = ["<think>", "\nThe user", " wants 12 × 7.\n\n", "10 × 7 = 70,", " 2 × 7 = 14.\n", "</think>",
              "\n\n12 × 7", " = **84**."]
    answer = lambda n: Message("assistant", "".join(pieces[:n]), [TokenRecord(p, Source.ACCEPTED, 0.9) for p in pieces[:n]])
    view = ChatView(RenderOptions(LIGHT))
    qtbot.addWidget(view)
    before = [Message("user", "What is 12 × 7?")]
    view.show_messages(before, answer_follows=True)
    for n in range(1, len(pieces) + 1):
        view.stream(before, answer(n))
    streamed = view.toPlainText().split("writing...")[1].strip()
    view.show_messages(before + [answer(len(pieces))])
    whole = view.toPlainText().split("regenerate")[1].strip()
    assert streamed == whole and whole.startswith("Thinking") and "think>" not in whole
    assert whole.endswith("12 × 7 = 84.")


def test_a_follow_up_finds_the_conversation_cached(qtbot, make_window):
    """The second question's prompt begins with the first turn, which the models' caches still
    hold: the acceptance view says how much of the prompt was not read again."""
    window = make_window()
    first = send_and_wait(qtbot, window)
    assert first.stats.cached_prompt_tokens == 0
    follow_up = send_and_wait(qtbot, window, "and then")
    cached, prompt = follow_up.stats.cached_prompt_tokens, follow_up.stats.prompt_tokens
    assert first.stats.prompt_tokens < cached < prompt
    assert f"{cached:,} of {prompt:,} prompt tokens cached" in window.acceptance.fields["first"].text()
    # the memory line counts the caches as they are after the answer
    memory = window.acceptance.fields["memory"]
    assert window.controller.engine.cache_bytes() > 0 and memory.text().endswith(f", caches {window.controller.engine.cache_bytes() / 2**20:,.0f} MiB")
    assert "weights add 100% to the target's" in memory.toolTip()  # the tiny draft is the target's twin


def test_the_message_is_read_while_it_is_typed(qtbot, make_window):
    """Soon after it is typed the models read the message: sent, it finds all of it but its last
    token cached, and the answer is the one it gets without reading ahead. The switch is remembered."""
    window = make_window()
    text = " ".join(f"t{i}" for i in range(5, 70))
    window.read_ahead_action.setChecked(False)
    window.composer.setPlainText(text)
    qtbot.wait(2 * READ_AHEAD_AFTER_MS)
    assert window.controller.engine.cache_bytes() == 0  # switched off: nothing read
    unread = send_and_wait(qtbot, window, text)
    assert unread.stats.cached_prompt_tokens == 0
    window.new_chat()
    window.controller.engine.forget()
    window.read_ahead_action.setChecked(True)
    window.composer.setPlainText(text)
    prompt_tokens = unread.stats.prompt_tokens
    qtbot.waitUntil(lambda: window.controller.engine._target.length == prompt_tokens - 1, timeout=10_000)
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.send_button.click()
    read_ahead = window.conversation.messages[-1]
    assert read_ahead.stats.cached_prompt_tokens == prompt_tokens - 1
    assert read_ahead.stats.token_ids == unread.stats.token_ids
    window.read_ahead_action.setChecked(False)
    window.save_settings()
    assert window.settings.value("read_ahead", True, bool) is False


def test_a_message_is_read_while_typing_goes_on(qtbot, make_window):
    """A steady typist never pauses long: the message is read meanwhile all the same."""
    window = make_window()
    for i in range(3 * READ_AHEAD_AFTER_MS // 100):  # a word every 0.1 s
        window.composer.insertPlainText(f" t{i + 5}")
        qtbot.wait(100)
    assert window.controller.engine._target.length > 0


def test_window_shortcuts_work_while_typing(qtbot, make_window):
    """The message box has the focus nearly always; its own key bindings must not swallow the
    window's shortcuts (Qt's text edits take Ctrl+K, delete to the end of the line, on Linux)."""
    window = make_window()
    send_and_wait(qtbot, window)
    window.composer.setFocus()
    window.composer.setPlainText("a message being written")
    window.composer.moveCursor(window.composer.textCursor().MoveOperation.Start)
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        qtbot.keyClick(window.composer, Qt.Key_K, Qt.ControlModifier)
    assert window.conversation.messages[-1].stats.comparison is not None
    assert window.composer.toPlainText() == "a message being written"


def test_the_status_bar_tells_how_far_a_long_prompt_is_read(qtbot, make_window, monkeypatch):
    from app.engine import loop

    monkeypatch.setattr(loop, "PROMPT_CHUNK", 4)
    window = make_window()
    shown = []
    window.statusBar().messageChanged.connect(shown.append)
    answer = send_and_wait(qtbot, window, "a question long enough to be read in several chunks of four")
    prompt = answer.stats.prompt_tokens
    assert f"Reading the prompt: 4 of {prompt:,} tokens..." in shown
    assert not window.statusBar().currentMessage().startswith("Reading")  # cleared once the answer came


def test_continue_goes_on_with_an_answer_cut_by_its_budget(qtbot, make_window):
    window = make_window(max_new_tokens=8)
    start = send_and_wait(qtbot, window).stats
    assert start.finish is FinishReason.LENGTH and window.continue_button.isEnabled()
    assert "regenerate  continue" in window.chat_view.toPlainText()  # links in the answer's header
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        window.continue_button.click()
    answer = window.conversation.messages[-1]
    assert [m.role for m in window.conversation.messages] == ["user", "assistant"]
    assert answer.stats.emitted == 16 and answer.stats.token_ids[:8] == start.token_ids
    assert window.chat_view.toPlainText().count("Assistant") == 1
    # the shortcut works while a message is being written, which stays in the box
    window.composer.setFocus()
    window.composer.setPlainText("a message being written")
    with qtbot.waitSignal(window.answer_finished, timeout=30_000):
        qtbot.keyClick(window.composer, Qt.Key_Return, Qt.ControlModifier | Qt.ShiftModifier)
    assert window.conversation.messages[-1].stats.emitted == 24
    assert window.composer.toPlainText() == "a message being written"
    saved = ChatStore(window.store.path).load_chat(window.conversation.id).messages
    assert len(saved) == 2 and saved[-1].stats.token_ids == window.conversation.messages[-1].stats.token_ids


def test_a_dropped_text_file_goes_into_the_message_and_a_binary_one_is_named(qtbot, make_window, tmp_path):
    from PySide6.QtCore import QMimeData, QUrl

    window = make_window()
    (tmp_path / "a.py").write_text("print(1)\n", encoding="utf-8")
    (tmp_path / "b.bin").write_bytes(b"\x00\x01")
    window.composer.setPlainText("Explain this:")
    window.composer.moveCursor(window.composer.textCursor().MoveOperation.End)
    files = QMimeData()
    files.setUrls([QUrl.fromLocalFile(str(tmp_path / "a.py")), QUrl.fromLocalFile(str(tmp_path / "b.bin"))])
    assert window.composer.canInsertFromMimeData(files)
    window.composer.insertFromMimeData(files)  # what a drop or a paste of files calls
    assert window.composer.toPlainText() == "Explain this:\n`a.py`:\n```python\nprint(1)\n```\n"
    assert "b.bin is not a text file" in window.statusBar().currentMessage()
    text = QMimeData()
    text.setText("plain text still pastes")
    window.composer.insertFromMimeData(text)
    assert window.composer.toPlainText().endswith("```\nplain text still pastes")


def test_the_chat_follows_a_document_laid_out_after_the_change(qtbot, make_window):
    """Qt lays a long document out in time slices, more of them while the engine keeps the cores
    busy: the scroll range grows after an update returns. A view left at the bottom follows it;
    one the user scrolled up stays where the user put it."""
    window = make_window(max_new_tokens=60)
    for text in ("t1 t2", "t3 t4", "t5 t6"):
        send_and_wait(qtbot, window, text)
    view = window.chat_view
    bar = view.verticalScrollBar()
    view.resize(view.width(), 120)
    qtbot.waitUntil(lambda: bar.maximum() > 100)
    view.show_messages(window.conversation.messages)  # at the bottom before: pinned there
    assert bar.value() == bar.maximum()
    bar.setRange(0, bar.maximum() + 300)  # what a later slice of layout does
    assert bar.value() == bar.maximum()
    bar.setValue(bar.maximum() // 2)  # the user scrolls up to read
    bar.setRange(0, bar.maximum() + 300)
    assert bar.value() < bar.maximum() - 300
    view.show_messages(window.conversation.messages)
    assert bar.value() < bar.maximum() - 4


def test_ctrl_c_and_sigterm_close_the_window_keeping_the_answer_and_settings(qtbot, make_window, tmp_path):
    import os
    import signal

    from app.ui.app import close_on_signals

    window = make_window(max_new_tokens=5000)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        close_on_signals(window)
        window.dark_action.setChecked(True)
        window.composer.setPlainText("long answer please")
        window.send_button.click()
        wait_until_streaming(qtbot, window)
        os.kill(os.getpid(), signal.SIGTERM)
        qtbot.waitUntil(lambda: not window.isVisible(), timeout=10_000)
    finally:
        signal.set_wakeup_fd(-1)
        for number, handler in handlers.items():
            signal.signal(number, handler)
    saved = ChatStore(tmp_path / "chats.sqlite3").load_chat(window.conversation.id).messages
    assert saved[-1].stats.finish is FinishReason.INTERRUPTED and saved[-1].tokens
    assert QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat).value("theme") == "dark"


def test_the_window_reopens_where_and_as_large_as_it_was_left(qtbot, make_window, monkeypatch):
    from PySide6.QtWidgets import QSplitter

    window = make_window()
    window.resize(1200, 700)
    window.splitters["columns"].setSizes([150, 600, 450])
    qtbot.waitUntil(lambda: window.width() == 1200)
    close_window(window)
    left = [bytes(window.saveGeometry())] + [bytes(s.saveState()) for s in window.splitters.values()]
    # Qt fits a restored window into the screen, and the offscreen one is 800x600 (narrower than
    # the window can be): what is given back to Qt is checked, not what that screen makes of it.
    restored = []
    monkeypatch.setattr(MainWindow, "restoreGeometry", lambda self, state: restored.append(bytes(state)) or True)
    monkeypatch.setattr(QSplitter, "restoreState", lambda self, state: restored.append(bytes(state)) or True)
    make_window()
    assert restored == left


def test_a_small_laptop_screen_holds_the_window_and_long_values_wrap_in_full(qtbot, make_window):
    window = make_window()
    assert window.minimumSizeHint().width() <= 1000  # 1366x768 at 125%, 1280x800 at 125%: 1024-1093 wide
    window.resize(window.minimumSizeHint().width(), 700)
    memory = window.acceptance.fields["memory"]
    window.acceptance.show_memory("target 1.05 GiB (lowbit), draft 0.31 GiB (3bit), caches 40 MiB (float16)")
    qtbot.waitUntil(lambda: memory.height() >= memory.heightForWidth(memory.width()) > memory.fontMetrics().height())
    below = window.acceptance.context
    assert below.y() >= memory.y() + memory.height()  # the next row starts under the wrapped value


QWEN3_STYLE_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}<assistant> "
                        "{% if enable_thinking is defined and enable_thinking is false %}t90 t91 {% endif %}")


def test_thinking_switches_off_where_the_chat_template_can(qtbot, make_window, tiny_models, monkeypatch):
    """A reasoning model's template (Qwen3's enable_thinking) opens the answer with an empty
    thinking block when thinking is off; the switch is off-limits where the template has none,
    and is remembered."""
    prompts = []
    original = SpeculativeEngine.generate
    monkeypatch.setattr(SpeculativeEngine, "generate",
                        lambda self, ids, options, cancel=None: prompts.append(ids) or original(self, ids, options, cancel))
    window = make_window()
    assert not window.controls.thinking.isEnabled()  # the tiny target has no template
    for model in tiny_models.values():
        model.tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    window = make_window()
    assert window.controls.thinking.isEnabled() and window.controls.thinking.isChecked()
    empty_thinking = window.controller.engine.target.tokenizer("t90 t91", add_special_tokens=False).input_ids
    send_and_wait(qtbot, window, "t5")
    assert prompts[-1][-2:] != empty_thinking
    window.controls.thinking.setChecked(False)
    send_and_wait(qtbot, window, "t6")
    assert prompts[-1][-2:] == empty_thinking
    window.save_settings()
    assert not make_window().controls.thinking.isChecked()


def test_add_model_picks_a_file_or_folder_and_refuses_a_missing_path(qtbot, make_window, tmp_path, monkeypatch):
    """Add model... opens a dialog with file and folder pickers (a desktop user does not type
    paths); a path that does not exist is named there and joins no picker; a hub id is taken as
    typed; the chosen file's folder is where the next pick starts."""
    from PySide6.QtWidgets import QDialogButtonBox, QFileDialog

    from app.ui.model_dialog import AddModelDialog

    gguf = tmp_path / "models" / "some-model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(EMPTY_GGUF)
    dialog = AddModelDialog(None, str(tmp_path))
    qtbot.addWidget(dialog)
    assert not dialog.buttons.button(QDialogButtonBox.Ok).isEnabled()
    dialog.source.setText(str(tmp_path / "nowhere.gguf"))
    dialog.accept()
    assert dialog.result() != AddModelDialog.Accepted and not dialog.problem.isHidden()
    assert "No such file or folder" in dialog.problem.text()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args: (str(gguf), "GGUF models (*.gguf)"))
    dialog.choose_file()
    assert dialog.chosen() == str(gguf) and dialog.problem.isHidden()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *args: str(tmp_path / "models"))
    dialog.choose_folder()
    assert dialog.chosen() == str(tmp_path / "models")
    dialog.source.setText("Qwen/Qwen2.5-0.5B-Instruct")
    dialog.accept()
    assert dialog.result() == AddModelDialog.Accepted

    window = make_window()
    picked = []

    def exec_(self):
        picked.append(self.start_folder)
        self.source.setText(str(gguf))
        return AddModelDialog.Accepted

    monkeypatch.setattr(AddModelDialog, "exec", exec_)
    window.models.add_model()
    assert window.controls.target.findData(str(gguf)) >= 0 and window.controls.draft.findData(str(gguf)) >= 0
    count = window.controls.target.count()
    window.models.add_model()
    assert picked[-1] == str(gguf.parent) and window.controls.target.count() == count


def test_prepared_models_on_disk_are_listed_and_deleted_but_not_those_loaded(qtbot, make_window, tmp_path, monkeypatch):
    """File > Prepared models on disk...: each copy with its size, last use and source (a missing
    file said so); the loaded pair's copies are not offered for deletion; Delete frees the others."""
    import json

    from app.engine.models import prepared_copies as prepared

    window = make_window(draft_precision="4bit")  # the 3-bit draft copy is not in use
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))  # once loaded (the kernel's build is cached)
    models = tmp_path / "cache" / "models"
    notes = {"Qwen2.5-Coder-1.5B-Instruct-lowbit": ("default-target", "lowbit"),  # the pair loaded now
             "Qwen2.5-Coder-0.5B-Instruct-3bit": ("default-draft", "3bit"),
             "old-0123456789abcdef-lowbit": (str(tmp_path / "deleted.gguf"), "lowbit"),
             "Qwen2.5-7B-Instruct-0123456789abcdef-lowbit": (str(tmp_path), "lowbit"),  # a model folder
             "chat-0123456789abcdef-lowbit": ("tiny/chat", "lowbit")}  # a hub id
    for name, (source, precision) in notes.items():
        (models / name).mkdir(parents=True)
        (models / name / "lowbit.safetensors").write_bytes(b"x" * 3_000_000)
        (models / name / prepared.NOTE).write_text(json.dumps({"source": source, "precision": precision}))
    (models / "Qwen2.5-Coder-0.5B-Instruct.gguf").write_bytes(b"y" * 500_000)  # assembled for the peer
    dialog = window.models.show_prepared_models()
    rows = {dialog.table.item(r, 0).text(): [dialog.table.item(r, c).text() for c in range(1, 5)]
            for r in range(dialog.table.rowCount())}
    assert rows["Qwen2.5-Coder-1.5B-Instruct (default)  (in use)"] == [
        "Low-bit (GGUF's own blocks)", "3.0 MB", "today", "the installed parts"]
    assert rows["deleted.gguf"][3] == str(tmp_path / "deleted.gguf") + "  (file not found)"
    assert rows["Qwen2.5-Coder-0.5B-Instruct.gguf"][3] == "a GGUF file assembled from the installed parts"
    assert rows[tmp_path.name][0] == rows["chat"][0] == "8-bit"  # a float model's low bit
    assert rows["chat"][3] == "tiny/chat"
    assert len(rows) == 6 and "6 copies, 15.5 MB in " in dialog.summary.text()
    assert not dialog.delete_button.isEnabled()
    dialog.table.selectAll()  # the loaded copy's row cannot be selected
    assert sorted(c.path.name for c in dialog.selected()) == [
        "Qwen2.5-7B-Instruct-0123456789abcdef-lowbit", "Qwen2.5-Coder-0.5B-Instruct-3bit",
        "Qwen2.5-Coder-0.5B-Instruct.gguf", "chat-0123456789abcdef-lowbit", "old-0123456789abcdef-lowbit"]
    dialog.delete_button.click()
    assert [p.name for p in models.iterdir()] == ["Qwen2.5-Coder-1.5B-Instruct-lowbit"]
    assert dialog.table.rowCount() == 1 and "1 copy, 3.0 MB" in dialog.summary.text()
    dialog.close()
    monkeypatch.delenv("SPECCHAT_CACHE")  # (the next window's kernel is the one built)
    loading = threading.Event()
    window = make_window(hold=loading, draft_precision="3bit")  # a pair still loading is in use too
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    dialog = window.models.show_prepared_models()
    assert dialog.table.item(0, 0).text().endswith("(in use)")
    dialog.close()
    loading.set()
    monkeypatch.delenv("SPECCHAT_CACHE")
    window = make_window(target="foreign-draft", draft_precision="3bit", extra_models=["foreign-draft"])
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    (models / "Qwen2.5-Coder-0.5B-Instruct-3bit").mkdir()
    (models / "Qwen2.5-Coder-0.5B-Instruct-3bit" / prepared.NOTE).write_text('["not", "a note"]')  # known by its name
    assert window.controller.engine.draft is None  # a draft of another vocabulary is not in use
    dialog = window.models.show_prepared_models()
    assert not any(dialog.table.item(row, 0).text().endswith("(in use)") for row in range(dialog.table.rowCount()))
    dialog.close()


def test_text_size_is_set_from_the_view_menu_and_kept(qtbot, make_window):
    """View > Larger text / Smaller text / Normal text size: the chat and the message box, within
    bounds, kept across answers and restarts."""
    from PySide6.QtWidgets import QApplication

    base = QApplication.font().pointSizeF()
    window = make_window()
    view_menu = window.menuBar().actions()[1].menu()
    actions = {action.text(): action for action in view_menu.actions()}
    sizes = lambda w: (w.chat_view.document().defaultFont().pointSizeF(), w.composer.font().pointSizeF())
    actions["Larger text"].trigger()
    actions["Larger text"].trigger()
    assert sizes(window) == (base + 2, base + 2)
    send_and_wait(qtbot, window)  # the answer's rendering keeps it
    assert sizes(window) == (base + 2, base + 2)
    window.save_settings()
    again = make_window()
    assert again.text_size == 2 and sizes(again) == (base + 2, base + 2)
    for _ in range(30):
        actions["Smaller text"].trigger()
    assert window.text_size == -4 and sizes(window) == (base - 4, base - 4)
    actions["Normal text size"].trigger()
    assert sizes(window) == (base, base)


def test_the_window_serves_its_models_while_it_chats(qtbot, make_window):
    """Chat > Serve on localhost: the API runs on the window's loop over the window's models; an API
    request and the window's own message take turns, and both answer as the engine does alone."""
    import socket

    import httpx

    from app.chat.prompt import chat_prompt_ids

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    window = make_window(server_port=port)
    window.server.action.setChecked(True)
    asked = [{"role": "user", "content": "t5 t9 t2"}]
    result = {}

    def ask() -> None:
        result["response"] = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                                        json={"messages": asked, "temperature": 0, "max_tokens": 12})

    client = threading.Thread(target=ask)
    client.start()
    answer = send_and_wait(qtbot, window, "t1 t2")  # the window chats meanwhile
    qtbot.waitUntil(lambda: "response" in result, timeout=60_000)
    client.join()
    response = result["response"]
    assert response.status_code == 200, response.text
    engine = window.controller.engine
    served = [token["id"] for token in response.json()["choices"][0]["provenance"]]
    plain = GenerationOptions(speculative=False, max_new_tokens=12)
    expected = [t.id for s in engine.generate(chat_prompt_ids(engine.target.tokenizer, asked), plain) for t in s.tokens]
    assert served == expected and answer.tokens
    qtbot.waitUntil(lambda: "1 request" in window.server.label.text(), timeout=5_000)
    assert window.server.url in window.server.label.text()
    window.server.action.setChecked(False)
    qtbot.waitUntil(lambda: not window.server.label.isVisible(), timeout=5_000)


def test_the_windows_server_refuses_web_pages_and_takes_its_key_and_origins_from_its_settings(
        qtbot, make_window, monkeypatch):
    """The window's switch serves under the rules of `python -m app serve`: a text/plain body, a
    foreign Origin and a rebound Host are refused; Chat > Server settings sets a key (generated
    there) and the origins allowed, and the next request obeys them."""
    import socket

    import httpx

    from app.ui.server_dialog import ServerSettingsDialog

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    window = make_window(server_port=port)
    window.server.action.setChecked(True)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "t5 t9"}], "max_tokens": 2}
    results = {}

    def ask() -> None:
        results["plain text"] = httpx.post(url, content=json.dumps(body), headers={"content-type": "text/plain"})
        results["page"] = httpx.post(url, json=body, headers={"origin": "https://evil.example"})
        results["rebound"] = httpx.post(url, json=body, headers={"host": f"evil.example:{port}"})
        results["mine"] = httpx.post(url, json=body, timeout=60)

    client = threading.Thread(target=ask)
    client.start()
    qtbot.waitUntil(lambda: len(results) == 4, timeout=60_000)
    assert [results[k].status_code for k in ("plain text", "page", "rebound", "mine")] == [415, 403, 403, 200]

    def accept(dialog):
        next(b for b in dialog.findChildren(QPushButton) if b.text() == "Generate").click()
        dialog.origins.setText("http://localhost:3000")
        key = dialog.api_key.text()
        results["key"] = key
        return True

    monkeypatch.setattr(ServerSettingsDialog, "exec", lambda dialog: accept(dialog))
    window.server.settings_action.trigger()
    key = results.pop("key")
    assert len(key) >= 24 and window.settings.value("server_api_key") == key
    results.clear()

    def ask_again() -> None:
        results["no key"] = httpx.post(url, json=body)
        results["key"] = httpx.post(url, json=body, headers={"authorization": f"Bearer {key}",
                                                            "origin": "http://localhost:3000"}, timeout=60)

    client = threading.Thread(target=ask_again)
    client.start()
    qtbot.waitUntil(lambda: len(results) == 2, timeout=60_000)
    assert results["no key"].status_code == 401 and results["key"].status_code == 200
    assert results["key"].headers["access-control-allow-origin"] == "http://localhost:3000"
    window.server.action.setChecked(False)


def test_switching_the_windows_server_off_stops_its_requests_at_the_next_step(qtbot, make_window):
    """Closing the window switches its server off first: an API answer running then stops within a
    step (it does not run on to its 3,000 tokens after the window has gone)."""
    import socket

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    window = make_window(server_port=port)
    window.server.action.setChecked(True)
    turns, engine = window.controller.turns, window.controller.engine
    long = {"messages": [{"role": "user", "content": "t5 t9"}], "max_tokens": 3000, "stream": True}
    ended = {}

    def ask() -> None:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=long, timeout=60) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
            ended["tokens"] = sum(len(chunk["choices"][0]["provenance"]) for chunk in chunks if chunk["choices"])

    client = threading.Thread(target=ask)
    client.start()
    qtbot.waitUntil(lambda: engine._busy.locked(), timeout=10_000)
    window.server.action.setChecked(False)
    qtbot.waitUntil(lambda: "tokens" in ended and not engine._busy.locked() and not turns.busy, timeout=10_000)
    client.join(10)
    assert ended["tokens"] < 3000


def test_regenerate_at_a_temperature_writes_another_answer_and_compare_reruns_its_seed(qtbot, make_window):
    """The seed is random unless fixed: each answer draws its own and keeps it, so Regenerate at
    0.8 writes another answer, and the seed saved with each is the one it was made with."""
    window = make_window(max_new_tokens=16)
    assert window.controls.seed.text() == "random"
    window.controls.temperature.setValue(0.8)
    send_and_wait(qtbot, window, "t1 t2 t3")
    for _ in range(2):
        with qtbot.waitSignal(window.answer_finished, timeout=30_000):
            window.regenerate_button.click()
    versions = window.conversation.messages[-1].versions
    assert len({version.content for version in versions}) > 1
    seeds = [json.loads(version.stats.made_with)["seed"] for version in versions]
    assert len(set(seeds)) == 3 and all(isinstance(seed, int) for seed in seeds)
    # fixed, with a fixed k: the same answer again (adaptive k drafts as the measured timings say,
    # and rejection sampling's draws follow the drafts: the distribution is exact either way)
    window.controls.seed.setValue(5)
    window.controls.adaptive.setChecked(False)
    for _ in range(2):
        with qtbot.waitSignal(window.answer_finished, timeout=30_000):
            window.regenerate_button.click()
    fixed = window.conversation.messages[-1].versions[-2:]
    assert fixed[0].content == fixed[1].content


def test_stop_works_while_the_answer_waits_for_its_turn(qtbot, make_window):
    """An API request (here a turn held as one holds it) runs: the window's message waits behind
    it, and Stop ends the wait at once instead of after that request."""
    window = make_window()
    turns = window.controller.turns
    free = asyncio.Event()
    holding = asyncio.get_event_loop().create_task(turns.hold(free.wait))
    qtbot.waitUntil(lambda: turns.busy, timeout=5_000)
    window.composer.setPlainText("t1 t2")
    window.send_button.click()
    qtbot.waitUntil(lambda: turns.waiting == 1, timeout=5_000)
    with qtbot.waitSignal(window.answer_finished, timeout=5_000):
        window.stop()
    assert turns.waiting == 0 and turns.busy  # the held turn is untouched
    free.set()
    qtbot.waitUntil(holding.done, timeout=5_000)
    assert send_and_wait(qtbot, window, "t3 t4").tokens


def test_the_engine_a_new_choice_replaces_is_let_go_before_the_new_pair_loads(qtbot, make_window):
    """On a GPU the old pair must leave its memory before the new one loads: nothing of the
    window's still holds the engine it replaces when the loader is called."""
    import gc
    import weakref

    window = make_window(extra_models=["other-draft"])
    old = weakref.ref(window.controller.engine)
    load, seen = window.controller.models.load, []

    def load_and_look(source, *args, **kwargs):
        gc.collect()
        seen.append((source, old() is None))
        return load(source, *args, **kwargs)

    window.controller.models.load = load_and_look
    window.controls.draft.setCurrentIndex(window.controls.draft.findData("other-draft"))
    qtbot.waitUntil(lambda: window.controller.engine is not None and window.controller.engine.draft.name == "tiny-2",
                    timeout=10_000)
    assert seen == [("other-draft", True)]
