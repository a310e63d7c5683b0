"""The compiled kernel's cache survives what a user's machine does to it: a build killed halfway
(a closed terminal, Ctrl-C, the OOM killer), a lock left behind, a cut library, a folder others
can write. Each start is a new process with its own cache folder, bounded in time: a start that
hangs fails the test instead of the run."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.engine.lowbit import kernel
from app.engine.lowbit.cpu import machine_isa

ROOT = Path(__file__).resolve().parents[1]
REPORT = ("from app.engine.lowbit import kernel; print('native' if kernel.native() is not None "
          "else 'reference: ' + str(kernel.why_not_native()))")

pytestmark = pytest.mark.skipif(machine_isa() is None or kernel.native() is None,
                                reason="no C++ kernel on this machine (no compiler or no AVX2)")


def start(cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", REPORT], cwd=ROOT, env={**os.environ, "SPECCHAT_CACHE": str(cache)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def report(cache: Path, timeout: float = 240) -> str:
    process = start(cache)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"a start with the cache in {cache} hung for over {timeout:.0f} s")
    return output.strip().splitlines()[-1]


def build_folder(cache: Path) -> Path:
    return next((cache / "kernels").iterdir())


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A cache whose first build was killed (the whole process group, compiler included) a few
    seconds in; the next start must build and load the kernel all the same."""
    cache = tmp_path_factory.mktemp("cache")
    first = start(cache)
    time.sleep(random.uniform(3, 10))
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert report(cache) == "native"
    return cache


def test_a_build_killed_halfway_does_not_block_the_next_start(cache):
    assert (build_folder(cache) / f"{kernel.MODULE_NAMES[machine_isa()]}.so.sha256").is_file()


def test_a_lock_left_by_a_killed_build_is_not_waited_for(cache):
    folder = build_folder(cache)
    library = folder / f"{kernel.MODULE_NAMES[machine_isa()]}.so"
    library.unlink()  # so that torch's builder runs, and meets its lock file
    (folder / "lock").write_text("")
    assert report(cache, timeout=120) == "native"
    assert library.is_file()


def test_a_cut_library_is_built_again(cache):
    library = build_folder(cache) / f"{kernel.MODULE_NAMES[machine_isa()]}.so"
    library.write_bytes(library.read_bytes()[: library.stat().st_size // 2])
    assert report(cache, timeout=120) == "native"
    assert kernel._load_checked(library.stem, library) is not None


def test_a_folder_others_could_write_is_emptied(tmp_path):
    folder = tmp_path / "kernels" / "abc"
    folder.mkdir(parents=True)
    (folder / "specchat_lowbit.so").write_bytes(b"someone else's code")
    folder.chmod(0o777)
    assert kernel._safe_build_folder(folder) == folder
    assert list(folder.iterdir()) == [] and folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_of_another_user_is_left_for_a_private_one(tmp_path):
    folder = tmp_path / "kernels" / "abc"
    folder.mkdir(parents=True)
    os.chown(folder, 65534, 65534)
    chosen = kernel._safe_build_folder(folder)
    assert chosen != folder and chosen.parent == folder.parent and chosen.stat().st_uid == os.getuid()
    assert kernel._safe_build_folder(folder) == chosen  # the next start finds its build there
    os.chown(chosen, 65534, 65534)  # taken too: a fresh private folder, never someone else's
    last = kernel._safe_build_folder(folder)
    assert last not in (folder, chosen) and last.stat().st_uid == os.getuid()


def test_a_library_writable_by_others_or_of_another_hash_is_not_loaded(cache, tmp_path):
    library = build_folder(cache) / f"{kernel.MODULE_NAMES[machine_isa()]}.so"
    copy = tmp_path / library.name
    copy.write_bytes(library.read_bytes())
    kernel._stamp(copy).write_text(kernel._file_sha256(copy))
    assert kernel._load_checked(copy.stem, copy) is not None
    copy.chmod(0o666)
    assert kernel._load_checked(copy.stem, copy) is None
    copy.chmod(0o600)
    kernel._stamp(copy).write_text("0" * 64)
    assert kernel._load_checked(copy.stem, copy) is None


def test_a_machine_without_a_compiler_runs_without_the_kernel_and_says_why(tmp_path):
    """A bundle on a machine with no C++ compiler: the low-bit layers run as int8, and the reason names it."""
    process = subprocess.run([sys.executable, "-c", REPORT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "SPECCHAT_CACHE": str(tmp_path), "CXX": "no-such-compiler"})
    assert "reference: no C++ compiler (no-such-compiler) on the PATH" in process.stdout
