"""The C++ kernel built with AddressSanitizer and UndefinedBehaviorSanitizer (SPECCHAT_SANITIZE=1),
its tests and the malformed-file cases run against that build: any read or write out of bounds,
use after free or undefined operation aborts the run with its report. Skipped, saying why, where
the compiler has no sanitizers. The build takes about 2 minutes and the run about 3 on 2 cores."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.lowbit import kernel

ROOT = Path(__file__).resolve().parents[1]
COMPILER = os.environ.get("CXX", "g++")
TESTS = ["tests/test_kernel_checks.py", "tests/test_lowbit.py", "tests/test_exact_attention.py",
         "tests/test_gguf_fuzz.py"]
# the other instruction sets' builds, and the copy of the normal build, are no kernel runs
DESELECTED = "not avx_vnni and not built_kernel"
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")


def sanitizer_runtimes(tmp_path: Path) -> list[str]:
    """The sanitizers' shared runtimes (preloaded: Python itself is not built with them), or a skip."""
    if shutil.which(COMPILER) is None or kernel.native() is None:
        pytest.skip(f"no C++ kernel or compiler ({COMPILER}) on this machine")
    probe = tmp_path / "probe.cpp"
    probe.write_text("int main() { return 0; }\n")
    built = subprocess.run([COMPILER, "-fsanitize=address,undefined", str(probe), "-o", str(tmp_path / "probe")],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"{COMPILER} cannot build with -fsanitize=address,undefined: {built.stderr.strip()[-300:]}")
    runtimes = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run([COMPILER, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not Path(path).is_file():
            pytest.skip(f"{COMPILER} names no shared {name}")
        runtimes.append(path)
    return runtimes


def test_the_kernel_and_the_malformed_files_under_the_sanitizers(tmp_path):
    env = {**os.environ, "SPECCHAT_SANITIZE": "1", "LD_PRELOAD": ":".join(sanitizer_runtimes(tmp_path)),
           # the interpreter's own allocations at exit are no leak of the kernel's; torch's libraries
           # come before the runtime in the link order of the extension, not of the process
           "ASAN_OPTIONS": "detect_leaks=0:verify_asan_link_order=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    built = subprocess.run([sys.executable, "-c", "from app.engine.lowbit import kernel; "
                            "print(kernel.why_not_native(), kernel.native().__file__)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert built.stdout.startswith("None "), built.stdout + built.stderr[-3000:]
    library = Path(built.stdout.split()[1])
    assert library != Path(kernel.native().__file__)  # a build of its own, beside the plain one
    assert "libasan" in subprocess.run(["ldd", str(library)], capture_output=True, text=True).stdout
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS, "-k", DESELECTED],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    output = run.stdout + run.stderr
    assert run.returncode == 0 and not any(report in output for report in REPORTS), output[-5000:]
