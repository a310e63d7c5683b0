"""The C++ kernel, compiled on first use with torch's extension builder and cached. It is built
for the CPU's best instruction set: AVX-512 VNNI or, on most laptops, AVX2 (with AVX-VNNI's
256-bit dot products on Intel since Alder Lake). When it cannot be built (no compiler, a CPU
with none of them), the pure-torch reference runs instead (slow)."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import stat
import sys
import threading
import warnings
from pathlib import Path

import torch

from ..files import cache_root
from ..files import private_folder, private_temporary_folder, write_text
from .cpu import ISAS, cpu_field, cpu_flags, machine_isa
from .packing import PackedWeight, dequantize, reference_linear

HERE = Path(__file__).parent
SOURCES = ["kernel.cpp", "decoder.cpp", "bindings.cpp"]
HEADERS = [HERE / "kernel.h", HERE / "vec16.h"]
# -ffp-contract=off keeps each float step as written (the linear layers of every build then give
# the same bits); -fopenmp makes at::parallel_for split the work over torch's threads (without it
# the header template runs serially), and the library binds to the libgomp torch has loaded.
COMMON_FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp"]
# one per build, all loadable at once
MODULE_NAMES = {isa: "specchat_lowbit" if isa == "avx512" else f"specchat_lowbit_{isa}" for isa in ISAS}
KERNEL_NAMES = {"avx512": "AVX-512", "avxvnni": "AVX-VNNI", "avx2": "AVX2", "vnni256": "AVX-VNNI (AVX-512 encoding)"}  # shown beside the precision


# SPECCHAT_SANITIZE=1: a build that checks every memory access and undefined operation (the
# tests run the kernel so, with the sanitizers' runtime preloaded); slow, never for use.
SANITIZER_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                   "-fno-sanitize-recover=undefined"]


def compile_flags(isa: str) -> list[str]:
    """The compiler's flags for `isa` on this machine: AVX-512's prefetching of the weights
    differs between AMD's cores and others' (see kernel.cpp's kFirstPassLocality)."""
    vendor_flags = ["-DSPECCHAT_PREFETCH_NTA"] if isa == "avx512" and cpu_field("vendor_id") == "AuthenticAMD" else []
    return COMMON_FLAGS + ISAS[isa][1] + vendor_flags + (SANITIZER_FLAGS if _sanitized() else [])


def _sanitized() -> bool:
    return os.environ.get("SPECCHAT_SANITIZE") == "1"


class NoCompiler(Exception):
    """The machine has no C++ compiler to build the kernel with (a bundle on a fresh machine)."""


_BUILD_LOCK = threading.Lock()  # one build at a time; later callers get the cached result


def native():
    """The compiled module for this machine, or None with the reason in `why_not_native()`."""
    return _build()[0]


def why_not_native() -> str | None:
    return _build()[1]


def build(isa: str):
    """The module built for `isa` (tests compare the builds), or None when this CPU lacks it."""
    with _BUILD_LOCK:
        return _build_for(isa)[0] if ISAS[isa][0] <= cpu_flags() else None


@functools.cache
def build_id() -> str:
    """Which arithmetic runs: a digest of the kernel's sources and flags, or "reference" when the
    pure-torch path does. Figures measured with one build do not hold for another."""
    return "reference" if native() is None else f"{machine_isa()}-{_source_digest(machine_isa())}"


@functools.cache
def _source_digest(isa: str) -> str:
    """Sources, flags and the torch and Python it is built against: what makes one build."""
    flags = compile_flags(isa)
    digest = hashlib.sha256(" ".join(flags + [torch.__version__, sys.implementation.cache_tag]).encode())
    for source in [HERE / name for name in SOURCES] + HEADERS:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def build_in_background() -> None:
    """Start compiling (or loading) the kernel on a side thread, so that a first start repacks
    the models and compiles at the same time; a caller that needs the kernel meanwhile waits.

    torch's builder is imported here first: it imports setuptools, which puts a finder at the
    head of sys.meta_path for one import and takes it out again, and a thread importing at that
    moment can skip the next finder and miss a module that is there (the default target's part 12
    was once "not installed" as the background build began)."""
    from torch.utils import cpp_extension  # noqa: F401

    threading.Thread(target=native, name="specchat-kernel-build", daemon=True).start()


def _build():
    with _BUILD_LOCK:
        return _build_for_machine()


@functools.cache  # every linear layer asks: decided once per process
def _build_for_machine():
    if os.environ.get("SPECCHAT_NO_NATIVE_KERNEL"):
        return None, "disabled by SPECCHAT_NO_NATIVE_KERNEL"
    isa = machine_isa()
    if isa is None:
        return None, "this CPU has neither AVX-512 VNNI nor AVX2"
    return _build_for(isa)


BUILD_WAIT_S = 300  # another process's build of the same sources: waited for this long at most


@functools.cache
def _build_for(isa: str):
    """The library from this build's folder, or built there. A library is loaded only when it is
    ours, no one else can write it or its folder, and its hash is the one noted when it was built;
    otherwise it is built again. Builds take a lock that dies with their process, so a build
    killed halfway never blocks the next start."""
    from filelock import FileLock, Timeout
    from torch.utils import cpp_extension

    name = MODULE_NAMES[isa]
    # One folder per build: a library already there was built from these very sources, so it is
    # loaded as it is. torch's builder would rebuild it (about 24 s) whenever the sources' paths
    # differ from the last build's, as they do between two checkouts or environments.
    folder = cache_root() / "kernels" / _source_digest(isa)
    try:
        folder = _safe_build_folder(folder)
        with FileLock(folder / "build.lock", timeout=BUILD_WAIT_S):
            library = folder / f"{name}{cpp_extension.LIB_EXT}"
            module = _load_checked(name, library)
            if module is not None:
                return module, None
            compiler = os.environ.get("CXX", "c++")  # what torch's builder runs
            if shutil.which(compiler) is None:
                raise NoCompiler(f"no C++ compiler ({compiler}) on the PATH to build the C++ kernel: "
                                        "install one (build-essential, Xcode's command line tools)")
            # torch's own lock file: one left by a killed build would make its builder wait forever,
            # and no other build of ours runs while we hold ours
            (folder / "lock").unlink(missing_ok=True)
            library.unlink(missing_ok=True)
            module = cpp_extension.load(
                name=name, sources=[str(HERE / source) for source in SOURCES], extra_cflags=compile_flags(isa),
                extra_ldflags=["-fopenmp", *(SANITIZER_FLAGS if _sanitized() else [])], build_directory=str(folder),
                verbose=False,
            )
            write_text(_stamp(library), _file_sha256(library))
            return module, None
    except Timeout:
        reason = (f"another process has been building the C++ kernel in {folder} for over {BUILD_WAIT_S} s "
                  "(SpecChat starts with the fast kernel once it is built)")
    except NoCompiler as error:
        reason = str(error)
    except Exception as error:  # no headers, no ninja: the reference path still works
        reason = f"could not build the C++ kernel ({str(error).strip().splitlines()[-1] if str(error) else error})"
    warnings.warn(f"SpecChat: {reason}; low-bit models run on the slow pure-torch path", stacklevel=2)
    return None, reason


def _safe_build_folder(folder: Path, ours_beside: bool = True) -> Path:
    """`folder` when it is ours and only we could write it; a library in a folder others could
    write may have been swapped for theirs, and would run as us: such a folder of ours is emptied
    and built again, someone else's is left for one of ours beside it (named by our user id, so
    that later starts reuse its build)."""
    if folder.exists():
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            if ours_beside:
                return _safe_build_folder(folder.with_name(f"{folder.name}-user{os.getuid()}"), ours_beside=False)
            return private_temporary_folder(folder.parent, f"{folder.name}-")
        if stat.S_IMODE(info.st_mode) & 0o022:
            shutil.rmtree(folder)
    return private_folder(folder)


def _load_checked(name: str, library: Path):
    """The module in `library` when the file is ours, not writable by others, and has the hash
    noted when it was built; None otherwise (a cut build, a file changed since, someone else's)."""
    try:
        info = library.lstat()
        noted = _stamp(library).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o022
            or noted != _file_sha256(library)):
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError:
        return None


def _stamp(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()  # a few megabytes


def linear(x: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
    """x [M, K] float32 -> [M, N] float32."""
    module = native()
    if module is None:
        return reference_linear(x, weight)
    return module.linear(x, *weight.tensors().values(), weight.group, weight.bits)


def rows(ids: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
    """ids [n] long -> the float weight rows [n, K] (an embedding lookup)."""
    module = native()
    if module is None:
        return dequantize_rows(ids, weight)
    return module.rows(ids, *weight.tensors().values(), weight.group, weight.bits)


def dequantize_rows(ids: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
    tiles = torch.unique(ids // 16)
    part = weight.tiles(tiles)
    position = {int(t): i for i, t in enumerate(tiles)}
    local = torch.tensor([position[int(i) // 16] * 16 + int(i) % 16 for i in ids.flatten()], dtype=torch.long)
    return dequantize(part)[local]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] float32 -> RMS-normalised rows times weight [D]."""
    module = native()
    if module is None or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    return module.rms_norm(x, weight, eps)
