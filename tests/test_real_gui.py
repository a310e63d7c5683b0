"""The desktop app on the real default pair: the screenshot command and a streamed turn."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QColor, QImage

from app.chat.store import ChatStore
from app.engine.models.loading import load_model
from app.engine.api import LOAD_DEFAULTS
from app.ui.main_window import MainWindow
from app.ui.theme import LIGHT
from tests.test_gui import close_window, send_and_wait, token_fragments

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[1]


def test_screenshot_command_writes_the_window(tmp_path):
    config = tmp_path / "config"
    settings = QSettings(str(config / "SpecChat" / "SpecChat.conf"), QSettings.IniFormat)
    settings.setValue("max_new_tokens", 24)
    # a fixed k: on so short an answer the cost-aware policy may rightly decode plainly throughout,
    # and this test is about colours, not about that choice
    settings.setValue("adaptive", False)
    settings.sync()
    shot = tmp_path / "shot.png"
    env = {**os.environ, "XDG_CONFIG_HOME": str(config), "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-m", "app", "--screenshot", str(shot), "--prompt", "Say hello in Python."],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    image = QImage(str(shot))
    assert (image.width(), image.height()) == (1280, 800)
    # The answer is there, coloured: text pixels in the chat area carry the accepted colour
    # (anti-aliasing blends glyph edges, so close counts).
    accepted = QColor(LIGHT.accepted)
    near = lambda c: abs(c.red() - accepted.red()) + abs(c.green() - accepted.green()) + abs(c.blue() - accepted.blue()) < 40
    assert sum(near(image.pixelColor(x, y)) for x in range(230, 880) for y in range(100, 650)) > 10


@pytest.fixture(scope="module")
def real_models():
    return {"default-draft": load_model("default-draft", precision=LOAD_DEFAULTS.draft_precision),
            "default-target": load_model("default-target", precision=LOAD_DEFAULTS.precision)}


def test_real_pair_turn_streams_with_provenance(qtbot, tmp_path, real_models):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    settings.setValue("max_new_tokens", 32)
    settings.setValue("adaptive", False)  # as above: the test needs drafted tokens
    window = MainWindow(ChatStore(tmp_path / "chats.sqlite3"), settings,
                        load=lambda source, device, dtype, report, **_: real_models[source])
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.controller.engine is not None, timeout=30_000)
    answer = send_and_wait(qtbot, window, "Write a Python function that adds two numbers.")
    assert answer.stats.emitted == 32 and "accepted" in {t.source for t in answer.tokens}
    for href, colour in token_fragments(window):
        assert colour == LIGHT.colour(window.chat_view.token_at(href).source).lower()
    close_window(window)
