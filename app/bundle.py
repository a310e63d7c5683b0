"""`python -m app bundle`: a one-folder PyInstaller bundle of the app for the platform it runs on
(packaging/specchat.spec), trimmed of what the app never loads, with its size reported."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "specchat.spec"
# what PyInstaller's hooks collect and the app never loads: torch's C++ tests and their helper
# libraries, protoc; Qt's virtual keyboard (a QML input method) and the QML it pulls in
TORCH_BIN_KEPT = {"torch_shm_manager"}  # torch's import looks for it
TRIMMED = ["torch/test", "torch/lib/libjitbackend_test.so", "torch/lib/libtorchbind_test.so",
           "torch/lib/libbackend_with_compiler.so", "torch/lib/libaoti_custom_ops.so",
           "PySide6/Qt/plugins/platforminputcontexts/libqtvirtualkeyboardplugin.so",
           "PySide6/Qt/lib/libQt6VirtualKeyboard.so.6", "PySide6/Qt/lib/libQt6VirtualKeyboardQml.so.6",
           "PySide6/Qt/lib/libQt6Quick.so.6", "PySide6/Qt/lib/libQt6Qml.so.6", "PySide6/Qt/lib/libQt6QmlMeta.so.6",
           "PySide6/Qt/lib/libQt6QmlModels.so.6", "PySide6/Qt/lib/libQt6QmlWorkerScript.so.6"]


def add_bundle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="where the bundle's folder goes")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "pyinstaller", help="PyInstaller's work folder")


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def write_icons(folder: Path) -> None:
    """The icon as Windows (.ico) and macOS (.icns) want it, drawn from its SVG."""
    from PIL import Image

    from .desktop_entry import render_icon

    folder.mkdir(parents=True, exist_ok=True)
    render_icon(1024).save(str(folder / "icon-1024.png"))
    image = Image.open(folder / "icon-1024.png")
    image.save(folder / "specchat.ico", sizes=[(size, size) for size in (16, 24, 32, 48, 64, 128, 256)])
    image.save(folder / "specchat.icns")


def run_bundle(args: argparse.Namespace) -> int:
    if getattr(sys, "frozen", False):
        print("error: a bundle cannot build a bundle; run this from a clone of SpecChat", file=sys.stderr)
        return 2
    try:
        import PyInstaller.__main__ as pyinstaller
    except ImportError:
        print("error: building the bundle needs PyInstaller: pip install -e '.[bundle]'", file=sys.stderr)
        return 2
    if not SPEC.is_file():
        print(f"error: {SPEC} is missing; build the bundle from a clone of SpecChat", file=sys.stderr)
        return 2
    import torch

    if torch.version.cuda:  # its libraries are part of it: none can be trimmed without breaking torch's import
        print(f"note: this torch is a CUDA {torch.version.cuda} build, and the bundle carries its CUDA libraries "
              "(gigabytes); for a CPU bundle, first: pip install torch==2.13.0 --index-url "
              "https://download.pytorch.org/whl/cpu")
    icons = args.work / "icons"
    write_icons(icons)
    os.environ["SPECCHAT_ICONS"] = str(icons)
    pyinstaller.run([str(SPEC), "--noconfirm", "--log-level", "WARN", "--distpath", str(args.dist),
                     "--workpath", str(args.work)])
    bundle = args.dist / "specchat"
    built = folder_size(bundle)
    internal = bundle / "_internal"
    torch_bin = [f"torch/bin/{path.name}" for path in (internal / "torch" / "bin").glob("*")  # (none on Windows)
                 if path.name not in TORCH_BIN_KEPT]
    for name in TRIMMED + torch_bin:
        path = internal / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for link in [path for path in internal.rglob("*") if path.is_symlink() and not path.exists()]:
        link.unlink()  # PyInstaller's links to what was trimmed
    size = folder_size(bundle)
    parts = sorted(((folder_size(p) if p.is_dir() else p.lstat().st_size, p.name) for p in internal.iterdir()), reverse=True)
    print(f"built {bundle}: {size / 2**20:,.0f} MB ({(built - size) / 2**20:,.0f} MB trimmed); the largest parts: "
          + ", ".join(f"{name} {part / 2**20:,.0f} MB" for part, name in parts[:5]))
    print(f"run it: {bundle / 'specchat'}  (its first start downloads the default models, 1.6 GB)")
    return 0
