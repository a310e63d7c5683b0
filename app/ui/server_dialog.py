"""The window's server settings: its port, an optional API key (generated on request, shown and
copyable) and the web origins whose pages may call it (none by default: a page the user visits
must not drive the models)."""
from __future__ import annotations

import secrets

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton,
                               QSpinBox, QWidget)


class ServerSettingsDialog(QDialog):
    def __init__(self, port: int, api_key: str, origins: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Server settings")
        self.port = QSpinBox(minimum=1024, maximum=65535, value=port)
        self.port.setAccessibleName("Port")
        self.api_key = QLineEdit(api_key, placeholderText="none: any program on this computer may call it")
        self.api_key.setAccessibleName("API key")
        self.api_key.setMinimumWidth(360)
        generate, copy = QPushButton("Generate"), QPushButton("Copy")
        generate.setToolTip("A new random key; clients send it as 'Authorization: Bearer KEY'")
        generate.clicked.connect(lambda: self.api_key.setText(secrets.token_urlsafe(24)))
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.api_key.text()))
        self.origins = QLineEdit(origins, placeholderText="none: requests from web pages are refused")
        self.origins.setAccessibleName("Allowed origins")
        self.origins.setToolTip("Web pages allowed to call the API, as their browser names them\n"
                                "(http://localhost:3000, https://chat.example.org), separated by commas; * for any.")
        key_row = QHBoxLayout()
        key_row.addWidget(self.api_key, 1)
        key_row.addWidget(generate)
        key_row.addWidget(copy)
        form = QFormLayout(self)
        form.addRow(QLabel("The OpenAI-compatible API listens on 127.0.0.1 only. It refuses bodies that are not\n"
                           "JSON, a Host that does not name it, and web pages not allowed below."))
        form.addRow("Port", self.port)
        form.addRow("API key", key_row)
        form.addRow("Allowed origins", self.origins)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
