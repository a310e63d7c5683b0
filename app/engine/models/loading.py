"""Loading models from any source through one function, and checking a draft/target pair.

Sources: "default-draft" / "default-target" (the packaged GGUF pair), a Hugging Face model
folder, a .gguf file, or a hub id already in the local Hugging Face cache.

Precision on CPU (`Precision`): a GGUF runs from its own low-bit blocks (`lowbit`, the default),
repacked once into the kernel's layout and cached; `4bit` re-quantizes every matrix to 4 bits and
`3bit` the feed-forward ones to 3 bits, the others to 4 (a cheaper draft: only the target decides
what is emitted); `fp32` dequantizes to float32 (the reference; cached as safetensors); `int8` is
fp32 with dynamically quantized int8 linears. A model folder in fp16/bf16/fp32 (or a hub id's, in
the local Hugging Face cache) is quantized on its first start, one tensor at a time, to 8 bits
(`lowbit`) or as `4bit` and `3bit` say, and cached likewise. Where the kernel cannot run, the
low-bit layers run as int8 through torch's matmul (lowbit/fallback). On a GPU every model runs as
one float model, in the dtype devices.pick_device gives.
"""
from __future__ import annotations

import errno
import gc
import hashlib
import shutil
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from . import defaults as default_models, prepared_copies as prepared
from ..files import remove_abandoned, written_whole
from ..choices import Precision
from .cpu_linear import model_bytes, pack_linears, quantize_linears_int8
from ..errors import IncompatibleModelsError, ModelError, in_one_line
from ..lowbit import gguf_check
from ..lowbit import prepared_tensors as lowbit_store
from ..lowbit.cpu import machine_isa
from ..lowbit.fallback import run_without_kernel
from ..lowbit.kernel import KERNEL_NAMES, build_in_background, why_not_native
from ..lowbit.memory import give_back_freed_memory
from ..lowbit.modules import quantize_model
from .. import devices
from ..memory_check import check_fits, check_float_load, weight_count
from .shared_tokenizers import folder_tokenizer

if TYPE_CHECKING:  # transformers' modeling code takes seconds to import: only where a load needs it
    from transformers import PreTrainedModel

Progress = Callable[[str, float | None], None]  # (stage, fraction done or None when unknown)


@dataclass
class LoadedModel:
    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    precision: str = "fp32"  # what the weights are ("lowbit", "3bit", "8bit", "bfloat16", "int8", "fp32")
    runs_on: str = ""  # the low-bit layers' kernel in words ("AVX2 kernel", or "slow path: why"); "" elsewhere
    context_limit: int = 0  # the user's context length, below the model's own (0: the model's)

    @property
    def label(self) -> str:
        """The precision and what runs it, for the UI and the benchmarks ("3bit, AVX2 kernel")."""
        return f"{self.precision}, {self.runs_on}" if self.runs_on else self.precision

    @property
    def max_context(self) -> int:
        """The longest context the model was made for."""
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def context_length(self) -> int:
        """The context in force: the user's context length, at most the model's."""
        return min(self.context_limit, self.max_context) if self.context_limit else self.max_context

    @property
    def memory_bytes(self) -> int:
        return model_bytes(self.model)

    @property
    def stop_tokens(self) -> frozenset[int]:
        """The end-of-sequence tokens the model and tokenizer name, and the special tokens that end a
        turn in the common chat formats: a GGUF names one end-of-sequence token, and Gemma's is
        <eos> while its turns end with <end_of_turn> (llama.cpp stops on these by their text too)."""
        eos = self.model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        ids |= {token_id for text, token_id in self.tokenizer.get_added_vocab().items() if text in END_OF_TURN}
        return frozenset(ids)


# Special tokens that end a turn (ChatML, Llama 3, Phi-3, Gemma, DeepSeek, ...), as llama.cpp's
# vocabulary recognises them
END_OF_TURN = frozenset({"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                         "<｜end▁of▁sentence｜>", "<EOT>"})


def out_of_space(error: BaseException) -> bool:
    """Whether a write failed for want of disk space (safetensors says so only in words)."""
    return (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or \
        "No space left on device" in str(error)


def cache_dir() -> Path:
    return prepared.folder()


def load_model(
    source: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Progress | None = None,
    precision: Precision | str = Precision.LOWBIT,
    packed_linear: bool = True,
    held: int = 0,
    kernel: bool = True,
) -> LoadedModel:
    """precision: see the module's notes; ignored on a GPU (devices.pick_device says its dtype).
    packed_linear: fp32 on CPU runs its linears through pre-packed oneDNN weights (same
    precision, about twice as fast at decoding batch sizes).
    held: the bytes the models already loaded beside this one take (its pair's other model).
    kernel: False runs the low-bit layers as a machine without the kernel does (lowbit/fallback),
    for `bench speed --cpu-paths` to measure beside it."""
    report = progress or (lambda stage, fraction: None)
    precision = Precision(precision)
    device = torch.device(device)
    on_cpu = device.type == "cpu"
    packaged = default_models.DEFAULTS.get(source)
    name = packaged.name if packaged else Path(source).name or source
    remove_abandoned(cache_dir())  # a killed first start's half-written copy: gigabytes
    model = None
    try:
        if on_cpu and precision.low_bit:
            build_in_background()  # compiles (first start only) while the weights load
            model, tokenizer = _load_low_bit(source, packaged, precision, report, held, kernel)
            without = why_not_native() if kernel else "the kernel turned off for this load"
            if without is not None:
                report(f"Converting {name} for torch's int8 matmul (no kernel: {without})", None)
                run_without_kernel(model)
            shown = "8bit" if precision is Precision.LOWBIT and prepared.float_model(source) else precision.value
            return LoadedModel(name, model, tokenizer, shown, _what_runs(without))
        if on_cpu:
            check_fits(name, None if packaged else Path(source).expanduser(), None, precision, prepared=False, held=held)
        else:
            check_float_load(name, *_float_copy_needs(source, packaged), dtype.itemsize, device, cache_dir())
        folder = _prepared_default(packaged, report) if packaged else _prepared_source(source, report)
        report(f"Loading {name}", None)
        model = _from_pretrained(folder, dtype=dtype, **_local_only(folder))
        tokenizer = _tokenizer(folder)
        if isinstance(folder, Path) and folder.parent == cache_dir():  # a float32 copy of a GGUF
            # (labelled with what it holds, whatever precision the CPU would run: on a GPU, the
            # low-bit choice left in the pickers must not name it, or the CPU's low-bit copy goes)
            prepared.note_use(folder, prepared.noted_source(source), Precision.FP32.value)
        model.to(device).eval()
    except ModelError:
        raise
    except Exception as error:
        if not on_cpu and _out_of_memory(error):
            model = None  # what did move goes back to the GPU before the message (the frames
            traceback.clear_frames(error.__traceback__)  # that moved it hold it too)
            gc.collect()
            devices.release_cached(device)
            raise ModelError(f"{name} does not fit in the memory of {devices.device_name(device)}: "
                             f"{in_one_line(error)}. Pick a smaller model, close what else uses the GPU, or run on "
                             "the CPU at low bit (SPECCHAT_DEVICE=cpu).") from error
        if out_of_space(error):
            if packaged and packaged.installed():  # the assembled GGUF too: the parts rebuild it, and the disk needs the room
                prepared.default_gguf(packaged).unlink(missing_ok=True)
            raise ModelError(f"Not enough disk space in {cache_dir()} to prepare {name} ({error}). A model's first "
                             "start writes a prepared copy there: at low bit about its file's size (1.6 GB for the "
                             "default pair), in float32 (a GPU, or the fp32 precision) 4 bytes per weight (9.6 GB "
                             "for the default pair). Free some space, or set SPECCHAT_CACHE to a folder on another "
                             "disk.") from error
        if isinstance(error, (OSError, ValueError, KeyError, RuntimeError)):
            raise ModelError(f"Cannot load model '{source}': {in_one_line(error)}") from error
        raise
    if not on_cpu:
        return LoadedModel(name, model, tokenizer, str(dtype).replace("torch.", ""))
    if precision is Precision.INT8:
        return LoadedModel(f"{name} (int8)", quantize_linears_int8(model), tokenizer, "int8")
    if packed_linear and dtype == torch.float32:
        pack_linears(model)
    return LoadedModel(name, model, tokenizer, "fp32")


def _out_of_memory(error: BaseException) -> bool:
    """A GPU's allocation failed (CUDA raises torch.OutOfMemoryError; MPS says so in words)."""
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _float_copy_needs(source: str, packaged: default_models.PackagedGGUF | None) -> tuple[int | None, int]:
    """(weights of the float model, bytes its first start writes: a GGUF's float32 copy, and the
    packaged file assembled beside it; 0 once written) of a model a GPU loads."""
    if packaged is not None:
        first = not (cache_dir() / packaged.name / "config.json").is_file()
        return packaged.weights, (4 * packaged.weights + packaged.size) if first and packaged.weights else 0
    path = _local_source(source)
    weights = weight_count(path)
    if path is None or not path.is_file() or weights is None:
        return weights, 0  # a model folder, or a hub id: read where it is
    first = not (_float_copy(path) / "config.json").is_file()
    return weights, 4 * weights if first else 0


def _what_runs(without_kernel: str | None) -> str:
    """What runs a low-bit model's layers, in words for the window: the kernel, or torch's int8
    matmul and why the kernel does not run."""
    if without_kernel is not None:
        return f"int8 torch matmul: {without_kernel}"
    return f"{KERNEL_NAMES[machine_isa()]} kernel"


def _load_low_bit(source: str, packaged: default_models.PackagedGGUF | None, precision: Precision,
                  report: Progress, held: int, kernel: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A GGUF's own blocks, or a model folder (a hub id's in the local Hugging Face cache too)
    quantized, from a prepared copy that the first start writes: later starts read it in seconds."""
    bits, feed_forward_bits = precision.requantized_bits
    if packaged is not None:
        path, copy = None, cache_dir() / f"{packaged.name}-{precision.value}"
    else:  # a file or folder, else a hub id's files in the local Hugging Face cache; a copy per version of them
        path = _local_source(source) or _local_source(str(_cached_hub_snapshot(source)))
        name = Path(source).name if path.is_dir() else path.stem
        copy = cache_dir() / f"{name}-{_file_key(path)}-{precision.value}"
    check_fits(packaged.name if packaged else Path(source).name, path, packaged.size if packaged else None,
               precision, prepared=lowbit_store.is_complete(copy), held=held,
               # (a missing compiler shows only once the build ends; the weights load meanwhile)
               without_kernel=not kernel or machine_isa() is None)
    if lowbit_store.is_complete(copy):
        report(f"Loading {copy.name}", None)
        try:
            loaded = lowbit_store.load(copy)
            prepared.note_use(copy, prepared.noted_source(source), precision.value)
            return loaded
        except Exception as error:  # a damaged cache (a cut write, a bad disk block): prepared again below
            warnings.warn(f"SpecChat: the prepared copy in {copy} could not be read ({error!r}); "
                          "it is prepared again from its source", stacklevel=2)
            shutil.rmtree(copy, ignore_errors=True)
    if path is not None and path.is_dir():
        model, tokenizer = _quantized_folder(path, bits or 8, feed_forward_bits, report)
    else:
        model, tokenizer = _repacked_gguf(packaged, path, bits, feed_forward_bits, copy.name, report)
    lowbit_store.save(model, tokenizer, copy)
    if packaged and packaged.installed():  # the parts can rebuild it (a downloaded one stays): the cache keeps the copy
        prepared.default_gguf(packaged).unlink()
    del model
    gc.collect()
    give_back_freed_memory()  # the source's reading, before the stored copy's buffer is filled
    loaded = lowbit_store.load(copy)  # as every later start runs it (its own module tree, huge pages)
    prepared.note_use(copy, prepared.noted_source(source), precision.value)  # drops a changed source's old copy
    return loaded


def _repacked_gguf(packaged: default_models.PackagedGGUF | None, path: Path | None, bits: int | None,
                   feed_forward_bits: int | None, name: str, report: Progress) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    gguf_path = default_models.assemble(
        packaged, prepared.default_gguf(packaged), lambda stage, f: report(stage, f)
    ) if packaged else path
    report(f"Repacking {name} (first start only)", None)
    from ..lowbit.loader import load_gguf_lowbit

    try:
        model = load_gguf_lowbit(gguf_path, bits, lambda f: report(f"Repacking {name}", f),
                                 feed_forward_bits=feed_forward_bits)
        return model, _gguf_tokenizer(gguf_path, model.config.model_type)
    except ModelError:  # refused by the structural check (gguf_file.parse): its own line
        raise
    except Exception as error:  # the gguf reader raises many kinds on a damaged file
        raise ModelError(f"Cannot read GGUF file {gguf_path}: {in_one_line(error)}") from error


def _quantized_folder(folder: Path, bits: int, feed_forward_bits: int | None,
                      report: Progress) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model folder quantized one tensor at a time, or, where its checkpoint does not map onto the
    model's parameters one to one, read whole as float32 and quantized."""
    from ..lowbit.folder_loader import NotStreamable, load_folder_lowbit

    label = f"Quantizing {folder.name} to {bits} bits (first start only)"
    report(label, None)
    try:
        try:
            model = load_folder_lowbit(folder, bits, feed_forward_bits, lambda f: report(label, f))
        except NotStreamable:
            model = quantize_model(_from_pretrained(folder, dtype=torch.float32).eval(), bits,
                                   feed_forward_bits=feed_forward_bits)
    except Exception as error:  # safetensors and transformers raise many kinds on a damaged folder
        raise ModelError(f"Cannot read model folder {folder}: {in_one_line(error)}") from error
    return model, _tokenizer(folder)


def _gguf_tokenizer(gguf_path: Path, model_type: str) -> PreTrainedTokenizerBase:
    """The GGUF's tokenizer. Naming its type spares AutoTokenizer from rebuilding the config
    through transformers' legacy GGUF reader first (10-20 s for a 150k vocabulary)."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    known = {"tokenizer_type": model_type} if TOKENIZER_MAPPING_NAMES.get(model_type) else {}
    return AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, trust_remote_code=False, **known)


def _cached_hub_snapshot(source: str) -> Path:
    """The folder of a hub id's files in the local Hugging Face cache, refused when it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except Exception as error:  # not cached, not a repository id, or the cache unreadable
        raise ModelError(f"Cannot load model '{source}': no such model folder or .gguf file, and no such hub id "
                         f"in the local Hugging Face cache ({HF_HUB_CACHE})") from error


def _file_key(path: Path) -> str:
    """What names a user's model's prepared copy: its path, and the size and time of the file, or of a
    folder's config and weight files (a new download in their place gets a copy of its own)."""
    if path.is_file():
        stat = path.stat()
        stats = f"{stat.st_size}|{stat.st_mtime_ns}"
    else:
        files = sorted([*path.glob("*.json"), *path.glob("*.safetensors")])
        stats = "|".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    return hashlib.sha256(f"{path.resolve()}|{stats}".encode()).hexdigest()[:16]


def _from_pretrained(*args, **kwargs) -> PreTrainedModel:
    """AutoModelForCausalLM.from_pretrained, importing transformers' modeling code only when a
    float model is loaded (a cached low-bit model needs none of it)."""
    from transformers import AutoModelForCausalLM

    from ..lowbit import skeleton

    model = AutoModelForCausalLM.from_pretrained(*args, trust_remote_code=False, **kwargs)
    skeleton.divide_rope_frequencies(model)  # a folder dequantized from a Llama 3.1+ GGUF
    return model


def _tokenizer(folder: str | Path) -> PreTrainedTokenizerBase:
    return folder_tokenizer(folder) if Path(folder).is_dir() else AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **_local_only(folder))


def _local_only(folder: str | Path) -> dict:
    return {} if Path(folder).is_dir() else {"local_files_only": True}


def _local_source(source: str) -> Path | None:
    """A model folder's or GGUF file's path, refused with the reason when it cannot be one; None for
    what reads as a hub id."""
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {path}")
        return path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a Hugging Face model folder (no config.json)")
        return path
    if path.exists() or source.startswith((".", "/", "~")):
        raise ModelError(f"Model not found: {source} (expected a model folder, a .gguf file or a hub id)")
    return None


def _prepared_source(source: str, report: Progress) -> str | Path:
    """A float model to load: a model folder, a GGUF's dequantized copy, or a hub id (loaded with
    local_files_only, so only from the local Hugging Face cache)."""
    path = _local_source(source)
    if path is None:
        return source
    return _dequantized(path, _float_copy(path), path.stem, report) if path.is_file() else path


def _float_copy(gguf_path: Path) -> Path:
    """Where a user's GGUF's dequantized float32 copy is kept."""
    return cache_dir() / f"{gguf_path.stem}-{_file_key(gguf_path)}"


def _prepared_default(packaged: default_models.PackagedGGUF, report: Progress) -> Path:
    folder = cache_dir() / packaged.name
    if (folder / "config.json").is_file():
        return folder
    gguf_path = default_models.assemble(
        packaged, prepared.default_gguf(packaged), lambda stage, f: report(stage, f)
    )
    _dequantized(gguf_path, folder, packaged.name, report)
    if packaged.installed():  # the safetensors copy replaces it; the parts can rebuild it
        gguf_path.unlink()
    return folder


def _dequantized(gguf_path: Path, folder: Path, name: str, report: Progress) -> Path:
    """Dequantize a GGUF once into a safetensors folder; later loads take seconds."""
    if (folder / "config.json").is_file():
        return folder
    report(f"Dequantizing {name} (first start only, about a minute)", None)
    from ..lowbit import gguf_file, loader

    try:
        reader = gguf_file.parse(gguf_path)  # checked first; then transformers reads it its own way
        model = _from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        loader.take_rope_divisors(model, reader)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, trust_remote_code=False)
    except ModelError:  # refused by the structural check (gguf_file.parse): its own line
        raise
    except Exception as error:  # the gguf reader raises many kinds on a damaged file
        raise ModelError(f"Cannot read GGUF file {gguf_path}: {in_one_line(error)}") from error
    # The weights are plain tensors now; drop the quantizer so the model saves as safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    report(f"Caching {name} weights", None)
    with written_whole(folder) as partial:  # config.json appears only with complete weights beside it
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    return folder


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """Only the tokenizer of a source (to check a pair before loading weights)."""
    if source in default_models.DEFAULTS:
        name = default_models.DEFAULTS[source].name
        prepared = [cache_dir() / f"{name}-{p.value}" for p in Precision if p.low_bit] + [cache_dir() / name]
        for folder in prepared:
            if (folder / "tokenizer_config.json").is_file():
                return folder_tokenizer(folder)
        return load_model(source).tokenizer  # prepares the default model once
    path = Path(source).expanduser()
    try:
        if path.suffix.lower() == ".gguf":
            gguf_check.check(path)
            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, trust_remote_code=False)
        return _tokenizer(path if path.is_dir() else source)
    except ModelError:
        raise
    except Exception as error:
        raise ModelError(f"Cannot read the tokenizer of '{source}': {in_one_line(error)}") from error


def vocabulary_mismatch(draft_tokenizer: PreTrainedTokenizerBase, target_tokenizer: PreTrainedTokenizerBase,
                        draft_name: str = "draft", target_name: str = "target") -> str | None:
    """Why two tokenizers cannot be paired, or None when they can."""
    if getattr(draft_tokenizer, "backend_tokenizer", None) is getattr(target_tokenizer, "backend_tokenizer", False):
        return None  # one vocabulary, read once (tokenizer_cache)
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    if _without_padding(draft_vocab) == _without_padding(target_vocab):
        return None
    return (
        f"Draft '{draft_name}' and target '{target_name}' do not share a vocabulary: "
        f"the draft's tokenizer has {len(draft_vocab):,} tokens, the target's {len(target_vocab):,}"
        + ("" if len(draft_vocab) != len(target_vocab) else " (same size, different tokens)")
        + ". Pick a draft from the target's model family."
    )


def _without_padding(vocab: dict[str, int]) -> dict[str, int]:
    """The vocabulary without the placeholders GGUF converters write for embedding rows no token
    uses ("[PAD151936]" at id 151936): a Qwen2.5 7B file has 128 more of them than its 0.5B draft's
    (152,064 rows against 151,936), around the same tokens. They are no text and nothing encodes to
    them; the rows past the smaller model's are never emitted (shared_vocab_width)."""
    return {token: index for token, index in vocab.items() if token != f"[PAD{index}]"}


def check_compatible(draft: LoadedModel, target: LoadedModel) -> None:
    """Refuse a pair whose tokenizers differ: their token ids would mean different text.

    Tokenizers are compared, not embedding rows: configs pad embeddings differently
    (151936 vs 152064 for Qwen2.5) around the same tokenizer.
    """
    reason = vocabulary_mismatch(draft.tokenizer, target.tokenizer, draft.name, target.name)
    if reason:
        raise IncompatibleModelsError(reason)


def shared_vocab_width(draft: LoadedModel, target: LoadedModel) -> int:
    """Logit columns both models have; padding rows beyond the tokenizer are never emitted."""
    return min(draft.model.config.vocab_size, target.model.config.vocab_size)
