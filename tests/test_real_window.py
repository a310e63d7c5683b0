"""The app as a user runs it: a real X server (Xvfb), the real default models, real key events
(xdotool): type a question, press Enter, get a saved answer, quit with Ctrl+Q.

`.ci/run` installs Xvfb, xdotool and Qt's X11 libraries when they are missing; elsewhere the
test is skipped with the reason. Run it alone with `python -m pytest -k real_window`."""
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.ui.platform_check import xcb_problem

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[1]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture
def x_display():
    missing = [tool for tool in ("Xvfb", "xdotool") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} (.ci/run installs them)")
    display = next(n for n in range(90, 200) if not Path(f"/tmp/.X{n}-lock").exists())
    server = subprocess.Popen(["Xvfb", f":{display}", "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: Path(f"/tmp/.X11-unix/X{display}").exists(), 20, "Xvfb")
    yield f":{display}"
    server.terminate()
    server.wait(10)


def answers(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as connection:
        return connection.execute(
            "SELECT content, json_extract(stats, '$.finish') FROM messages WHERE role = 'assistant'").fetchall()


def test_real_window_turn_with_key_events(tmp_path, x_display, monkeypatch):
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)  # the tests' offscreen default
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    problem = xcb_problem()
    if problem:
        pytest.skip(problem)
    env = {**os.environ, "DISPLAY": x_display, "SPECCHAT_DATA": str(tmp_path / "data"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    config = tmp_path / "config" / "SpecChat"
    config.mkdir(parents=True)
    (config / "SpecChat.conf").write_text("[General]\nmax_new_tokens=24\n")
    app = subprocess.Popen([sys.executable, "-m", "app"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        xdotool = lambda *args: subprocess.run(["xdotool", *args], env=env, capture_output=True, text=True)
        window = wait_for(lambda: app.poll() is not None or xdotool("search", "--name", "^SpecChat$").stdout.split(),
                          120, "the window")
        assert app.poll() is None, app.stdout.read()
        window = window[0]
        xdotool("windowfocus", "--sync", window)
        xdotool("type", "--delay", "20", "Say hello in Python.")
        db = tmp_path / "data" / "chats.sqlite3"
        # Enter until the models are loaded: while they load the message waits in the box
        wait_for(lambda: xdotool("key", "--window", window, "Return") and answers(db), 600, "the answer")
        done = wait_for(lambda: [a for a in answers(db) if a[1] in ("length", "stop")], 300, "the answer to finish")
        assert done[0][0].strip()
        xdotool("key", "--window", window, "ctrl+q")
        assert app.wait(60) == 0
    finally:
        if app.poll() is None:
            app.kill()
    assert answers(tmp_path / "data" / "chats.sqlite3") == done  # quitting lost and added nothing
