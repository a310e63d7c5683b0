"""One window owns a data folder: a second start brings the first one's window to the front and
ends, rather than two windows overwriting each other's chats.

The ownership is a lock on a file in the data folder (an flock: the system lets go of it when the
process ends, however it ends); the wake-up is a local socket only this user can connect to."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from filelock import FileLock, Timeout
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QWidget

from ..engine.api import private_folder


class SingleInstance:
    def __init__(self, data_folder: Path) -> None:
        self.folder = private_folder(data_folder)
        self._lock = FileLock(self.folder / "specchat.lock")
        digest = hashlib.sha256(str(self.folder.resolve()).encode()).hexdigest()[:16]
        self.name = f"specchat-{os.getuid() if hasattr(os, 'getuid') else 0}-{digest}"
        self._server: QLocalServer | None = None

    def acquire(self) -> bool:
        """Whether this process now owns the folder (False: another one does)."""
        try:
            self._lock.acquire(timeout=0)
            return True
        except Timeout:
            return False

    def serve(self, window: QWidget) -> None:
        """Brings `window` to the front whenever a later start knocks."""
        QLocalServer.removeServer(self.name)  # a socket file left by a killed run
        self._server = QLocalServer(window)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.newConnection.connect(lambda: self._raise(window))
        self._server.listen(self.name)

    def _raise(self, window: QWidget) -> None:
        while self._server.hasPendingConnections():
            self._server.nextPendingConnection().disconnectFromServer()
        window.showNormal()
        window.raise_()
        window.activateWindow()

    def knock(self) -> bool:
        """Asks the owner to bring its window to the front; whether it could be reached."""
        socket = QLocalSocket()
        socket.connectToServer(self.name)
        reached = socket.waitForConnected(2000)
        socket.disconnectFromServer()
        return reached
