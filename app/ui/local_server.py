"""The window's *Serve on localhost* switch: the OpenAI-compatible API (serve/server.py) runs on
the window's own loop, in this process, over the models the window has loaded (here or on a
server); its requests, the window's chat and model loads take turns at the engine in order of
arrival. Chat > Server settings sets its port, key and allowed web origins (server_dialog.py),
under the same rules as `python -m app serve` (serve/guard.py)."""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QMainWindow

from ..chat.controller import ChatController
from .controls import ControlsPanel

if TYPE_CHECKING:
    from ..serve.guard import Access
    from ..serve.server import ServerState

DEFAULT_PORT = 8765


class LocalServer:
    def __init__(self, window: QMainWindow, controller: ChatController, controls: ControlsPanel, settings: QSettings,
                 show_error: Callable[[str, str], None]) -> None:
        """window: the parent of its actions and dialogs, whose status bar says what it serves."""
        self.window, self.controller, self.controls, self.settings = window, controller, controls, settings
        self.show_error = show_error
        self.port = int(settings.value("server_port", DEFAULT_PORT))
        self.api_key = str(settings.value("server_api_key", ""))
        self.origins = str(settings.value("server_origins", ""))
        self.action = QAction(window, checkable=True)
        self.action.toggled.connect(self.switch)
        self.settings_action = QAction("Server settings...", window)
        self.settings_action.triggered.connect(self.edit_settings)
        self._name_action()
        self.label = QLabel()
        window.statusBar().addPermanentWidget(self.label)
        self.label.hide()
        self._refresh = QTimer(window, interval=1000)
        self._refresh.timeout.connect(self._show)
        self.state: ServerState | None = None
        self._server = None
        controller.models_ready.connect(self._models_changed)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _name_action(self) -> None:
        self.action.setText(f"Serve on localhost:{self.port}")
        self.action.setToolTip("An OpenAI-compatible API for your editor, agents and scripts, over the models loaded "
                               f"here: http://127.0.0.1:{self.port}/v1 (loopback only"
                               + (", with an API key" if self.api_key else "") + ")")

    def access(self) -> Access:
        from ..serve.guard import Access, parse_origins

        return Access(self.api_key or None, parse_origins(self.origins), "127.0.0.1")

    def edit_settings(self) -> None:
        from .server_dialog import ServerSettingsDialog

        dialog = ServerSettingsDialog(self.port, self.api_key, self.origins, self.window)
        if not dialog.exec():
            return
        port = dialog.port.value()
        self.api_key, self.origins = dialog.api_key.text().strip(), dialog.origins.text().strip()
        for key, value in (("server_port", port), ("server_api_key", self.api_key), ("server_origins", self.origins)):
            self.settings.setValue(key, value)
        if self.state is not None:
            self.state.access = self.access()  # read at each request
        if port != self.port:
            serving = self._server is not None
            self.switch(False)
            self.port = port
            if serving:  # on the new port
                self.start()
        self._name_action()

    def switch(self, on: bool) -> None:
        if on and self._server is None:
            self.start()
        elif not on and self._server is not None:
            self._server.should_exit = True  # its task ends once the requests running now stop
            self.state.cancel_all()  # they stop at their next step, and those waiting now
            self._server = None
            self._refresh.stop()
            self.label.hide()

    def start(self) -> None:
        import uvicorn

        from ..serve.server import ServerState, create_app  # FastAPI loads when first asked for

        listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listening.bind(("127.0.0.1", self.port))
            # listening from now: a client that connects before uvicorn's task first runs waits in
            # the backlog instead of being refused
            listening.listen(128)
        except OSError as error:
            listening.close()
            self.action.setChecked(False)
            self.show_error("Cannot serve", f"Port {self.port} is taken ({error.strerror}); choose another "
                                   "in Chat > Server settings.")
            return
        controller = self.controller
        self.state = ServerState(lambda: controller.engine, self._model_name(), self.controls.generation_options,
                                 self.access(), controller.turns, controller.make_room)
        self._server = _in_the_window(uvicorn.Config(create_app(self.state), log_level="warning"))
        asyncio.get_running_loop().create_task(self._server.serve(sockets=[listening]))
        self._refresh.start()
        self._show()

    def _models_changed(self, ready) -> None:
        if self.state is not None:
            self.state.model_name = self._model_name()

    def _model_name(self) -> str:
        engine = self.controller.engine
        return engine.target.name if engine is not None else self.controls.load_options().target

    def _show(self) -> None:
        served = self.state.requests_served if self.state else 0
        self.label.setText(f"Serving {self.url} · {served} request{'s' if served != 1 else ''}")
        self.label.show()


def _in_the_window(config):
    """uvicorn's server without its signal handlers: Ctrl+C and SIGTERM close the window (ui/app.py)."""
    import uvicorn

    class WindowServer(uvicorn.Server):
        def capture_signals(self):
            return contextlib.nullcontext()

    return WindowServer(config)
