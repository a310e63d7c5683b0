"""Before the window opens on Linux: can Qt's X11 (xcb) platform plugin load? Without a few
X libraries Qt prints "Could not load the Qt platform plugin xcb" and exits; we name the missing
libraries and the command that installs them on the user's distribution instead."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# soname -> (Debian/Ubuntu package, Fedora package)
PACKAGES = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libSM.so.6": ("libsm6", "libSM"),
    "libICE.so.6": ("libice6", "libICE"),
    **{f"libxcb-{name}.so.{version}": (f"libxcb-{name}{version}", "libxcb")
       for name, version in [("randr", 0), ("shm", 0), ("sync", 1), ("xfixes", 0), ("render", 0), ("shape", 0),
                             ("xkb", 1), ("xinerama", 0), ("xinput", 0)]},
    "libxcb.so.1": ("libxcb1", "libxcb"),
}


def xcb_plugin() -> Path | None:
    try:
        import PySide6
    except ImportError:
        return None
    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return plugin if plugin.exists() else None


def missing_libraries(ldd_output: str) -> list[str]:
    """The sonames `ldd` could not find, each once, in order."""
    missing = [line.split("=>")[0].strip() for line in ldd_output.splitlines() if "=> not found" in line]
    return list(dict.fromkeys(missing))


def distribution(os_release: str) -> str:
    """'debian', 'fedora' or 'other', from the text of /etc/os-release."""
    fields = dict(line.split("=", 1) for line in os_release.splitlines() if "=" in line)
    names = " ".join(fields.get(key, "").strip('"') for key in ("ID", "ID_LIKE")).split()
    if {"debian", "ubuntu"} & set(names):
        return "debian"
    if {"fedora", "rhel", "centos"} & set(names):
        return "fedora"
    return "other"


def install_hint(missing: list[str], distro: str) -> str:
    debian = sorted({PACKAGES.get(name, (None, None))[0] or name for name in missing})
    fedora = sorted({PACKAGES.get(name, (None, None))[1] or name for name in missing})
    commands = {"debian": f"sudo apt-get install {' '.join(debian)}", "fedora": f"sudo dnf install {' '.join(fedora)}"}
    lines = [f"SpecChat cannot open its window: Qt's X11 plugin needs {', '.join(missing)}, "
             "which this system does not have.", "Install them with:"]
    if distro in commands:
        lines.append(f"    {commands[distro]}")
    else:
        lines += [f"    {commands['debian']}    (Debian, Ubuntu)", f"    {commands['fedora']}    (Fedora, RHEL)"]
    lines.append("Or run without a window: QT_QPA_PLATFORM=offscreen python -m app --screenshot shot.png --prompt ...")
    return "\n".join(lines)


def xcb_problem() -> str | None:
    """The message to print instead of starting Qt, or None when the window can open (or the
    check does not apply: not Linux, another platform plugin chosen, a Wayland session)."""
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if not sys.platform.startswith("linux") or platform not in ("", "xcb"):
        return None
    if not platform and os.environ.get("WAYLAND_DISPLAY"):
        return None
    plugin, ldd = xcb_plugin(), shutil.which("ldd")
    if plugin is None or ldd is None:
        return None
    try:
        output = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    missing = missing_libraries(output)
    if not missing:
        return None
    try:
        distro = distribution(Path("/etc/os-release").read_text())
    except OSError:
        distro = "other"
    return install_hint(missing, distro)
