"""`specchat --install-desktop-entry`: the app in the desktop's menu (freedesktop.org: a `.desktop`
file and the icon at each size the icon theme names), running this very program: the bundle's
executable, or this Python with `-m app`."""
from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
RESOURCES = Path(__file__).resolve().parent.parent / "resources"


@functools.cache
def _application():
    """QPainter needs an application object; drawing needs no screen."""
    from PySide6.QtGui import QGuiApplication

    if QGuiApplication.instance() is None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    return QGuiApplication.instance() or QGuiApplication(sys.argv[:1])


def render_icon(size: int):
    """The icon drawn from its SVG at `size` pixels (a QImage)."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _application()
    image = QImage(size, size, QImage.Format_ARGB32)
    image.fill(Qt.transparent)
    painter = QPainter(image)
    QSvgRenderer(str(RESOURCES / "icon.svg")).render(painter)
    painter.end()
    return image


def command() -> str:
    """What runs this app again: the bundle's executable, else this Python with the app."""
    if getattr(sys, "frozen", False):
        return quoted(sys.executable)
    return f"{quoted(sys.executable)} -m app"


def quoted(argument: str) -> str:
    """An Exec key's argument as the desktop entry spec quotes one (double quotes, not a shell's; a
    backslash doubled again for the file's string value)."""
    if not re.search(r"[\s\"'\\><~|&;$*?#()`]", argument):
        return argument
    return ('"' + re.sub(r'(["`$\\])', r"\\\1", argument) + '"').replace("\\", "\\\\")


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def install() -> list[Path]:
    """Writes the entry and the icons under the user's data folder; returns what it wrote."""
    home = data_home()
    written = []
    for size in ICON_SIZES:
        path = home / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "specchat.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not render_icon(size).save(str(path)):
            raise OSError(f"could not write {path}")
        written.append(path)
    entry = home / "applications" / "specchat.desktop"
    entry.parent.mkdir(parents=True, exist_ok=True)
    lines = (RESOURCES / "specchat.desktop").read_text(encoding="utf-8").splitlines()
    entry.write_text("\n".join(f"Exec={command()}" if line.startswith("Exec=") else line for line in lines) + "\n",
                     encoding="utf-8")
    written.append(entry)
    return written


def run_install() -> int:
    try:
        written = install()
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"installed {written[-1]} (runs {command()}) and its icons at {len(ICON_SIZES)} sizes in "
          f"{data_home() / 'icons' / 'hicolor'}", file=sys.stderr)
    return 0
