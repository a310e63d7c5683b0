"""A model as a Hugging Face folder (safetensors, bfloat16, its tokenizer and chat template), from
anything the app loads (a GGUF file, a default model, a folder), so that a serving engine such as
vLLM can serve the very model the app runs here."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ..choices import Precision
from ..errors import ModelError
from . import prepared_copies
from .loading import Progress, load_model


def export_hf(source: str, folder: Path, report: Progress | None = None) -> Path:
    """Writes `source` to `folder` (which must not exist yet); raises ModelError for a model that
    cannot be read or a folder that cannot be written (nothing is left half written)."""
    folder = folder.expanduser()
    if folder.exists():
        raise ModelError(f"{folder} exists already: name a new folder")
    # the GGUF's blocks dequantized (fp32), then bfloat16: what vLLM serves on CPU and GPU alike
    earlier = {copy.path for copy in prepared_copies.copies()}
    try:
        loaded = load_model(source, "cpu", torch.float32, report, precision=Precision.FP32, packed_linear=False)
    finally:  # the float32 copy that loading prepared (gigabytes) is no use to the app afterwards
        for copy in prepared_copies.copies():
            if copy.path not in earlier:
                prepared_copies.delete(copy)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        loaded.model.to(torch.bfloat16).save_pretrained(partial, safe_serialization=True)
        loaded.tokenizer.save_pretrained(partial)
        partial.rename(folder)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise ModelError(f"cannot write {folder}: {error.strerror or error}") from error
    return folder
