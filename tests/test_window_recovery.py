"""The window after an accident: a damaged file of chats, a run that died while loading models, a
second start while one runs. Offscreen, on tiny models; the accidents themselves are real (a file
of garbage, a process ended by SIGSEGV in the middle of a load, a second process)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QWidget

from app.chat.store import ChatStore
from app.engine.model_pool import ModelPool
from app.engine.api import LoadOptions
from app.ui.main_window import MainWindow
from app.ui.single_instance import SingleInstance
from tests.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_pair():
    model = tiny_model(seed=1)
    return {"default-target": model, "default-draft": model, "other-target": model}


def window(qtbot, tmp_path, tiny_pair, **settings) -> MainWindow:
    config = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    for key, value in {"extra_models": ["other-target"], **settings}.items():
        config.setValue(key, value)
    made = MainWindow(ChatStore(tmp_path / "chats.sqlite3"), config,
                      load=lambda source, *args, **kwargs: tiny_pair[source])
    qtbot.addWidget(made)
    qtbot.waitUntil(lambda: made.controller.engine is not None, timeout=10_000)
    return made


def test_a_damaged_file_of_chats_is_set_aside_and_said(qtbot, tmp_path, tiny_pair):
    (tmp_path / "chats.sqlite3").write_bytes(b"\x00garbage" * 512)
    opened = window(qtbot, tmp_path, tiny_pair)
    aside = list(tmp_path.glob("chats.sqlite3.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"\x00garbage" * 512
    assert "moved aside" in opened.last_error and str(aside[0]) in opened.last_error
    assert opened.store.list_chats() == []


CRASHING_LOAD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from app.engine.model_pool import ModelPool
    from app.engine.api import LoadOptions
    def load(source, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGSEGV)  # as a kernel reading past a hostile file's tensor would
    cache = ModelPool(load, load_marker=Path(sys.argv[1]))
    cache.engine(cache.request(), LoadOptions(target="other-target"), lambda *a: None)
""")


def test_a_run_that_died_loading_a_pair_leaves_its_name(tmp_path):
    marker = tmp_path / "loading.json"
    died = subprocess.run([sys.executable, "-c", CRASHING_LOAD, str(marker)], cwd=ROOT, capture_output=True, timeout=120)
    assert died.returncode == -signal.SIGSEGV
    assert ModelPool(load_marker=marker).crashed_load == {"target": "other-target", "draft": "default-draft"}


def test_the_next_start_after_a_load_that_died_takes_the_default_pair(qtbot, tmp_path, tiny_pair):
    (tmp_path / "loading.json").write_text(json.dumps({"target": "other-target", "draft": "default-draft",
                                                       "pid": 2**22 + 1}))
    opened = window(qtbot, tmp_path, tiny_pair, target="other-target")
    assert opened.controls.load_options() == LoadOptions()
    assert "ended while it loaded other-target" in opened.last_error
    assert not (tmp_path / "loading.json").exists()  # this run's load finished: no marker left


def test_a_load_that_fails_cleanly_leaves_no_marker(tmp_path):
    def failing(*args, **kwargs):
        raise OSError("no such file")

    cache = ModelPool(failing, load_marker=tmp_path / "loading.json")
    with pytest.raises(OSError):
        cache.engine(cache.request(), LoadOptions(), lambda *a: None)
    assert not (tmp_path / "loading.json").exists()


def test_a_second_start_brings_the_first_window_forward_and_ends(qtbot, tmp_path):
    first = SingleInstance(tmp_path / "data")
    assert first.acquire()
    shown = QWidget()
    qtbot.addWidget(shown)
    first.serve(shown)
    env = {**os.environ, "SPECCHAT_DATA": str(tmp_path / "data"), "QT_QPA_PLATFORM": "offscreen"}
    second = subprocess.Popen([sys.executable, "-m", "app"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    with qtbot.waitSignal(first._server.newConnection, timeout=60_000):
        pass
    output, _ = second.communicate(timeout=60)
    assert second.returncode == 0
    assert "already running" in output and "brought to the front" in output
    assert not (tmp_path / "data" / "chats.sqlite3").exists()  # the second touched nothing
    assert shown.isVisible()


def test_the_data_folder_is_free_again_once_its_owner_dies(tmp_path):
    hold = ("import sys, time, pathlib; from app.ui.single_instance import SingleInstance; "
            "owner = SingleInstance(pathlib.Path(sys.argv[1])); assert owner.acquire(); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert not SingleInstance(tmp_path).acquire()
    holder.kill()  # SIGKILL: no clean-up runs
    holder.wait()
    assert SingleInstance(tmp_path).acquire()


def test_a_window_closed_while_its_models_load_is_no_crash_at_the_next_start(qtbot, tmp_path, tiny_pair):
    """Closing the window while a pair loads is the user's choice, not a crash to report next time."""
    import threading

    hold = threading.Event()
    config = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    loading = MainWindow(ChatStore(tmp_path / "chats.sqlite3"), config,
                         load=lambda source, *args, **kwargs: hold.wait(10) and tiny_pair[source])
    qtbot.addWidget(loading)
    qtbot.waitUntil(lambda: (tmp_path / "loading.json").exists(), timeout=10_000)
    loading.close()  # the app then ends at once, its load thread with it (app.leave_work_behind)
    try:
        assert not (tmp_path / "loading.json").exists()
    finally:
        hold.set()
        qtbot.waitUntil(lambda: not [t for t in threading.enumerate() if t.name.startswith("specchat-load")],
                        timeout=30_000)  # not torn down at the interpreter's exit (an abort)
