"""What the app writes to disk: whole or not at all, owner-only, per process, and what a killed
run left behind is cleared away."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine import files

ROOT = Path(__file__).resolve().parents[1]


def test_a_replaced_file_is_whole_private_and_named_by_its_process_until_then(tmp_path):
    target = tmp_path / "note.json"
    target.write_text("old")
    with files.replaced(target) as partial:
        assert partial.name == f"note.json.partial-{os.getpid()}"
        partial.write_text("new")
        assert target.read_text() == "old"
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o600
    with pytest.raises(OSError), files.replaced(target) as partial:
        partial.write_text("half")
        raise OSError("disk full")
    assert target.read_text() == "new" and list(tmp_path.iterdir()) == [target]


def test_a_folder_written_whole_is_private_inside(tmp_path):
    folder = tmp_path / "cache" / "copy"
    with files.written_whole(folder) as partial:
        (partial / "sub").mkdir()
        (partial / "sub" / "weights").write_bytes(b"w")
    assert (folder / "sub" / "weights").read_bytes() == b"w"
    assert (folder / "sub" / "weights").stat().st_mode & 0o777 == 0o600
    assert folder.parent.stat().st_mode & 0o777 == 0o700


def test_a_private_folders_new_parents_are_private_too(tmp_path):
    files.private_folder(tmp_path / "cache" / "kernels" / "abc")
    for folder in (tmp_path / "cache", tmp_path / "cache" / "kernels", tmp_path / "cache" / "kernels" / "abc"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder


def test_an_existing_folder_of_ours_is_made_private(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    files.private_folder(folder)
    assert folder.stat().st_mode & 0o777 == 0o700


def test_what_a_killed_process_was_writing_goes_and_a_live_ones_stays(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = tmp_path / f"Model-lowbit.partial-{dead.stdout.strip()}"
    (abandoned / "inside").mkdir(parents=True)
    old_style = tmp_path / "Model-3bit.partial"
    old_style.mkdir()
    live = files.partial_name(tmp_path / "Other-lowbit")
    live.mkdir()
    kept = tmp_path / "Model-fp32"
    kept.mkdir()
    assert sorted(files.remove_abandoned(tmp_path)) == sorted([abandoned, old_style])
    assert sorted(tmp_path.iterdir()) == sorted([live, kept])
