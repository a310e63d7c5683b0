"""Loading models from any source through one function, and checking a draft/target pair.

Sources: "default-draft" / "default-target" (the packaged GGUF pair), a Hugging Face model
folder, a .gguf file, or a hub id already in the local Hugging Face cache. GGUF weights are
dequantized once and cached as safetensors under the user cache directory.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from . import default_models
from .cpu_linear import model_bytes, pack_linears, quantize_linears_int8
from .errors import ModelError

Progress = Callable[[str, float | None], None]  # (stage, fraction done or None when unknown)


@dataclass
class LoadedModel:
    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def memory_bytes(self) -> int:
        return model_bytes(self.model)

    @property
    def stop_tokens(self) -> frozenset[int]:
        eos = self.model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)


def cache_dir() -> Path:
    return Path(os.environ.get("SPECCHAT_CACHE") or platformdirs.user_cache_dir("specchat")) / "models"


def pick_device() -> tuple[torch.device, torch.dtype, str]:
    """The device, its dtype, and why, in words for the UI."""
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16, f"CUDA: {torch.cuda.get_device_name(0)}"
    return torch.device("cpu"), torch.float32, "CPU: no CUDA device visible to torch"


def load_model(
    source: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Progress | None = None,
    packed_linear: bool = True,
    int8: bool = False,
) -> LoadedModel:
    """packed_linear: on CPU in float32, run linear layers through pre-packed oneDNN weights
    (same precision, about twice as fast at decoding batch sizes).
    int8: on CPU, dynamic int8 quantization of the linear layers (about 3x faster again, but
    approximate): meant for draft models, whose precision never changes what is emitted."""
    report = progress or (lambda stage, fraction: None)
    try:
        if source in default_models.DEFAULTS:
            folder, name = _prepared_default(default_models.DEFAULTS[source], report), default_models.DEFAULTS[source].name
        else:
            folder, name = _prepared_source(source, report), Path(source).name or source
        report(f"Loading {name}", None)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **_local_only(folder))
        tokenizer = AutoTokenizer.from_pretrained(folder, **_local_only(folder))
    except ModelError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise ModelError(f"Cannot load model '{source}': {error}") from error
    model.to(device).eval()
    on_cpu = torch.device(device).type == "cpu"
    if int8 and on_cpu:
        model = quantize_linears_int8(model)
        name += " (int8)"
    elif packed_linear and on_cpu and dtype == torch.float32:
        pack_linears(model)
    return LoadedModel(name=name, model=model, tokenizer=tokenizer)


def _local_only(folder: str | Path) -> dict:
    return {} if Path(folder).is_dir() else {"local_files_only": True}


def _prepared_source(source: str, report: Progress) -> str | Path:
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {path}")
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        return _dequantized(path, cache_dir() / f"{path.stem}-{key}", path.stem, report)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a Hugging Face model folder (no config.json)")
        return path
    if path.exists() or source.startswith((".", "/", "~")):
        raise ModelError(f"Model not found: {source} (expected a model folder, a .gguf file or a hub id)")
    return source  # a hub id: loaded with local_files_only, so only from the local HF cache


def _prepared_default(packaged: default_models.PackagedGGUF, report: Progress) -> Path:
    folder = cache_dir() / packaged.name
    if (folder / "config.json").is_file():
        return folder
    gguf_path = default_models.assemble(
        packaged, cache_dir() / f"{packaged.name}.gguf", lambda stage, f: report(stage, f)
    )
    _dequantized(gguf_path, folder, packaged.name, report)
    gguf_path.unlink()  # the safetensors copy replaces it; the parts can rebuild it
    return folder


def _dequantized(gguf_path: Path, folder: Path, name: str, report: Progress) -> Path:
    """Dequantize a GGUF once into a safetensors folder; later loads take seconds."""
    if (folder / "config.json").is_file():
        return folder
    report(f"Dequantizing {name} (first start only, about a minute)", None)
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except Exception as error:  # the gguf reader raises many kinds on a damaged file
        raise ModelError(f"Cannot read GGUF file {gguf_path}: {error}") from error
    # The weights are plain tensors now; drop the quantizer so the model saves as safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    report(f"Caching {name} weights", None)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)  # config.json appears only with complete weights beside it
    return folder


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """Only the tokenizer of a source (to check a pair before loading weights)."""
    if source in default_models.DEFAULTS:
        return AutoTokenizer.from_pretrained(_prepared_default(default_models.DEFAULTS[source], lambda *_: None))
    path = Path(source).expanduser()
    try:
        if path.suffix.lower() == ".gguf":
            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        return AutoTokenizer.from_pretrained(path if path.is_dir() else source, **_local_only(path))
    except Exception as error:
        raise ModelError(f"Cannot read the tokenizer of '{source}': {error}") from error


def vocabulary_mismatch(draft_tokenizer: PreTrainedTokenizerBase, target_tokenizer: PreTrainedTokenizerBase,
                        draft_name: str = "draft", target_name: str = "target") -> str | None:
    """Why two tokenizers cannot be paired, or None when they can."""
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    if draft_vocab == target_vocab:
        return None
    return (
        f"Draft '{draft_name}' and target '{target_name}' do not share a vocabulary: "
        f"the draft's tokenizer has {len(draft_vocab):,} tokens, the target's {len(target_vocab):,}"
        + ("" if len(draft_vocab) != len(target_vocab) else " (same size, different tokens)")
        + ". Pick a draft from the target's model family."
    )


def check_compatible(draft: LoadedModel, target: LoadedModel) -> None:
    """Refuse a pair whose tokenizers differ: their token ids would mean different text.

    Tokenizers are compared, not embedding rows: configs pad embeddings differently
    (151936 vs 152064 for Qwen2.5) around the same tokenizer.
    """
    reason = vocabulary_mismatch(draft.tokenizer, target.tokenizer, draft.name, target.name)
    if reason:
        raise ModelError(reason)


def shared_vocab_width(draft: LoadedModel, target: LoadedModel) -> int:
    """Logit columns both models have; padding rows beyond the tokenizer are never emitted."""
    return min(draft.model.config.vocab_size, target.model.config.vocab_size)
