"""The app as a user runs it: a real X server (Xvfb), the real default models, real key events
(xdotool): type a question, press Enter, get a saved answer, quit with Ctrl+Q; start it again and
find that chat open.

Each step waits for something the app itself reports (`--verbose` prints the window's events)
before the next one, and fails within a bounded time naming the step, with a screenshot of the
screen in the test's folder. `.ci/run` installs Xvfb, xdotool and Qt's X11 libraries when they are
missing; elsewhere the test is skipped with the reason. Run it alone with
`python -m pytest -k real_window`."""
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.ui.platform_check import xcb_problem

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Say hello in Python."
FOCUSED = "the message box has the keyboard focus"
# The first start prepares the default models (about a minute here); later ones load in seconds.
MODELS_LOAD_S = 300
ANSWER_S = 180


@pytest.fixture
def x_display():
    missing = [tool for tool in ("Xvfb", "xdotool") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} (.ci/run installs them)")
    # -displayfd: the server picks a free display and writes its number once it accepts clients
    reader, writer = os.pipe()
    server = subprocess.Popen(["Xvfb", "-displayfd", str(writer), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                              pass_fds=(writer,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(writer)
    with os.fdopen(reader) as numbers:
        number = numbers.readline().strip()  # empty when the server died first
    if not number:
        server.kill()
        pytest.fail(f"Xvfb did not start (exit code {server.wait(10)})")
    yield f":{number}"
    server.terminate()
    server.wait(10)


class RunningApp:
    """`python -m app --verbose` on a display: its output collected line by line as it comes."""

    def __init__(self, env: dict, folder: Path) -> None:
        self.env, self.folder = env, folder
        self.process = subprocess.Popen([sys.executable, "-m", "app", "--verbose"], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()

    def xdotool(self, *args: str) -> str:
        return subprocess.run(["xdotool", *args], env=self.env, capture_output=True, text=True, timeout=30).stdout

    def wait_for(self, condition, timeout: float, step: str):
        """condition()'s first true value; fails naming `step` when the time is up or the app ends."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            if self.process.poll() is not None:
                self.fail(f"the app exited with code {self.process.returncode} while waiting for {step}")
            if self.logged("error shown"):
                self.fail(f"the app showed an error while waiting for {step}")
            time.sleep(0.25)
        self.fail(f"timed out after {timeout:.0f} s waiting for {step}")

    def logged(self, text: str, since: int = 0) -> str | None:
        return next((line for line in self.lines[since:] if text in line), None)

    def fail(self, what: str) -> None:
        shot = self.folder / "screen.png"
        grab = ("import sys; from PySide6.QtGui import QGuiApplication; app = QGuiApplication([]); "
                "sys.exit(0 if app.primaryScreen().grabWindow(0).save(sys.argv[1]) else 1)")
        saved = subprocess.run([sys.executable, "-c", grab, str(shot)], env={**self.env, "QT_QPA_PLATFORM": "xcb"},
                               capture_output=True, timeout=60).returncode == 0
        pytest.fail(f"{what}; screenshot: {shot if saved else 'could not be taken'}; the app's last lines:\n"
                    + "".join(self.lines[-30:]), pytrace=False)


def answers(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as connection:
        return connection.execute(
            "SELECT content, json_extract(stats, '$.finish') FROM messages WHERE role = 'assistant'").fetchall()


def type_question(app: RunningApp, window: str) -> None:
    """Focuses the window, types the question and presses Enter, until the app reports a message
    of the question's length (sent, or waiting for the models). Keys typed before the message box
    holds the focus go nowhere, so each try starts from an emptied box."""
    for _ in range(4):
        app.xdotool("windowfocus", "--sync", window)
        app.wait_for(lambda: app.logged(FOCUSED), 20, "the message box to take the keyboard focus")
        start = len(app.lines)
        app.xdotool("key", "--clearmodifiers", "ctrl+a", "BackSpace")
        app.xdotool("type", "--delay", "20", QUESTION)
        app.xdotool("key", "Return")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if app.logged(f"message of {len(QUESTION)} characters", since=start):
                return
            time.sleep(0.25)
    app.fail(f"the typed question ({len(QUESTION)} characters) never reached the message box in 4 tries")


def quit_with_ctrl_q(app: RunningApp, *where: str) -> None:
    """Ctrl+Q (xdotool key's options `where`), and the app's clean exit within a minute."""
    app.xdotool("key", *where, "ctrl+q")
    try:
        assert app.process.wait(60) == 0
    except subprocess.TimeoutExpired:
        app.fail("the app to quit within 60 s of Ctrl+Q")


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
    db = tmp_path / "data" / "chats.sqlite3"
    app = RunningApp(env, tmp_path)
    try:
        window = app.wait_for(lambda: app.xdotool("search", "--onlyvisible", "--name", "^SpecChat$").split(), 120,
                              "the window to be mapped")[0]
        type_question(app, window)
        app.wait_for(lambda: app.logged("models ready"), MODELS_LOAD_S, "the models to load")
        app.wait_for(lambda: app.logged("answer finished"), ANSWER_S, "the answer to finish")
        done = app.wait_for(lambda: [a for a in answers(db) if a[1] in ("length", "stop")], 10,
                            "the finished answer in the database")
        assert done[0][0].strip()
        quit_with_ctrl_q(app, "--window", window)
    finally:
        if app.process.poll() is None:
            app.process.kill()
    assert answers(db) == done  # quitting lost and added nothing

    # started again: the chat of the last run is open, its question and answer shown
    again = RunningApp(env, tmp_path)
    try:
        window = again.wait_for(lambda: again.xdotool("search", "--onlyvisible", "--name", "^SpecChat$").split(), 120,
                                "the window to be mapped again")[0]
        again.wait_for(lambda: again.logged("reopened the last chat: 2 messages"), 30, "the last chat to reopen")
        again.xdotool("windowfocus", "--sync", window)
        again.wait_for(lambda: again.logged(FOCUSED), 20, "the message box to take the keyboard focus")
        quit_with_ctrl_q(again, "--clearmodifiers")
    finally:
        if again.process.poll() is None:
            again.process.kill()
