"""`specchat --install-desktop-entry` from a pip install: the menu entry runs this Python with the
app, and the icon is there at every size the icon theme names."""
import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtGui import QImage

from app.desktop_entry import ICON_SIZES

ROOT = Path(__file__).resolve().parents[1]


def test_the_desktop_entry_runs_this_app_and_has_its_icons(tmp_path):
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    ran = subprocess.run([sys.executable, "-m", "app", "--install-desktop-entry"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    entry = (tmp_path / "applications" / "specchat.desktop").read_text()
    assert f"Exec={sys.executable} -m app\n" in entry and "Type=Application" in entry
    for size in ICON_SIZES:
        icon = QImage(str(tmp_path / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "specchat.png"))
        assert (icon.width(), icon.height()) == (size, size) and icon.pixelColor(size // 2, size // 2).alpha() == 255


def test_a_path_with_spaces_and_signs_is_quoted_as_the_desktop_entry_spec_says():
    from app.desktop_entry import quoted

    assert quoted("/usr/bin/python3") == "/usr/bin/python3"
    assert quoted("/opt/Spec Chat/specchat") == '"/opt/Spec Chat/specchat"'
    assert quoted('/opt/a$b"c') == '"/opt/a\\\\$b\\\\"c"'  # \$ and \" in the Exec line, each backslash doubled in the file
