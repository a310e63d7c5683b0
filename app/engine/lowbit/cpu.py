"""What the CPU offers the kernel, read from /proc/cpuinfo without torch: the window picks its
defaults (the draft's precision) before the engine is imported."""
from __future__ import annotations

import functools
import os
from pathlib import Path

# Per instruction set: the CPU flags it needs and the compiler flags (kernel.py adds the common
# ones). In order of preference; "vnni256" is the AVX-VNNI kernel in AVX-512's encoding of the same
# instructions, never better than "avx512" where it runs: it lets the tests check that kernel on
# AVX-512 machines (no AVX-VNNI CPU is at hand here).
ISAS = {
    "avx512": ({"avx512f", "avx512bw", "avx512_vnni"},
               ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]),
    "avxvnni": ({"avx2", "fma", "f16c", "avx_vnni"}, ["-mavx2", "-mfma", "-mf16c", "-mavxvnni", "-DSPECCHAT_VNNI256"]),
    "avx2": ({"avx2", "fma", "f16c"}, ["-mavx2", "-mfma", "-mf16c"]),
    "vnni256": ({"avx2", "fma", "f16c", "avx512vl", "avx512_vnni"},
                ["-mavx2", "-mfma", "-mf16c", "-mavx512vl", "-mavx512vnni", "-DSPECCHAT_VNNI256"]),
}


@functools.cache
def cpu_field(name: str) -> str:
    """A field of the first CPU in /proc/cpuinfo ("" when unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    line = next((line for line in text.splitlines() if line.split(":", 1)[0].strip() == name), "")
    return line.split(":", 1)[-1].strip()


def cpu_flags() -> set[str]:
    return set(cpu_field("flags").split())


def machine_isa() -> str | None:
    """The instruction set the kernel is built for here: SPECCHAT_KERNEL_ISA if set (and the CPU
    has it), else the best the CPU has; None when it has neither."""
    flags = cpu_flags()
    wanted = os.environ.get("SPECCHAT_KERNEL_ISA")
    candidates = [wanted] if wanted in ISAS else list(ISAS)
    return next((isa for isa in candidates if ISAS[isa][0] <= flags), None)
