"""A Linux desktop without Qt's X11 libraries gets the exact packages to install."""
import subprocess

from app.ui import platform_check
from app.ui.platform_check import distribution, install_hint, missing_libraries

LDD = """\
\tlibQt6XcbQpa.so.6 => /x/libQt6XcbQpa.so.6 (0x00007f08d26eb000)
\tlibxcb-cursor.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f08d256e000)
\tlibxcb-icccm.so.4 => not found
\tlibweird.so.7 => not found
"""


def test_missing_libraries_become_the_install_command_of_the_distribution():
    missing = missing_libraries(LDD)
    assert missing == ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libweird.so.7"]
    debian = install_hint(missing, distribution('ID=ubuntu\nID_LIKE=debian\n'))
    assert "sudo apt-get install libweird.so.7 libxcb-cursor0 libxcb-icccm4" in debian and "dnf" not in debian
    fedora = install_hint(missing, distribution('ID="fedora"\n'))
    assert "sudo dnf install libweird.so.7 xcb-util-cursor xcb-util-wm" in fedora and "apt-get" not in fedora
    other = install_hint(missing, distribution("ID=arch\n"))
    assert "apt-get" in other and "dnf" in other


def test_the_check_matches_what_ldd_reports_here(monkeypatch):
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    plugin = platform_check.xcb_plugin()
    assert plugin is not None  # PySide6 ships the plugin
    missing = missing_libraries(subprocess.run(["ldd", str(plugin)], capture_output=True, text=True).stdout)
    problem = platform_check.xcb_problem()
    assert (problem is None) == (not missing)
    assert all(name in problem for name in missing) if missing else True
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert platform_check.xcb_problem() is None  # no window needed, no check
