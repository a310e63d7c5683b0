"""Loading from every kind of source, and clear messages for bad model files and pairs."""
import hashlib
import sys
from pathlib import Path

import pytest
import torch

from app.engine.models import defaults as default_models
from app.engine.engine import GenerationOptions, SpeculativeEngine
from app.engine.errors import ModelError
from app.engine.models.loading import Precision, check_compatible, load_model
from tests.helpers import EMPTY_GGUF, generated_ids
from tests.tiny import tiny_model


def test_model_folder_loads_through_load_model(tmp_path, tiny_target):
    tiny_target.model.save_pretrained(tmp_path / "m")
    tiny_target.tokenizer.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), precision=Precision.FP32)
    prompt = [1, 2, 3]
    assert generated_ids(SpeculativeEngine(loaded), prompt, speculative=False, max_new_tokens=8) == generated_ids(
        SpeculativeEngine(tiny_target), prompt, speculative=False, max_new_tokens=8
    )


def test_missing_gguf_file(tmp_path):
    with pytest.raises(ModelError, match="GGUF file not found"):
        load_model(str(tmp_path / "nope.gguf"))


def test_corrupt_gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 100)
    with pytest.raises(ModelError, match="broken.gguf is not a readable GGUF file: GGUF version 0"):
        load_model(str(bad))


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelError, match="not a Hugging Face model folder"):
        load_model(str(tmp_path))


def test_hub_id_not_in_local_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="Cannot load model 'nobody/no-such-model'"):
        load_model("nobody/no-such-model")


def test_pairs_with_different_tokenizers_are_refused():
    target = tiny_model(seed=1, vocab_size=96)
    with pytest.raises(ModelError, match="draft's tokenizer has 64 tokens, the target's 96"):
        SpeculativeEngine(target, tiny_model(seed=2, vocab_size=64))
    with pytest.raises(ModelError, match="same size, different tokens"):
        check_compatible(tiny_model(seed=2, prefix="w"), target)


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three installed 'packages' holding parts of a file, like the default model wheels."""
    payload = [b"alpha" * 1000, b"beta" * 1000, b"gamma" * 1000]
    for index, data in enumerate(payload, start=1):
        (tmp_path / f"fakepart{index}" / "data").mkdir(parents=True)
        (tmp_path / f"fakepart{index}" / "__init__.py").write_text("")
        (tmp_path / f"fakepart{index}" / "data" / f"part{index:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path))
    whole = b"".join(payload)
    yield default_models.PackagedGGUF("Fake", "fakepart", 3, "fake-part", "1.0", len(whole), hashlib.sha256(whole).hexdigest())
    for index in range(1, 4):
        sys.modules.pop(f"fakepart{index}", None)


def test_parts_assemble_and_verify(fake_parts, tmp_path):
    seen = []
    out = default_models.assemble(fake_parts, tmp_path / "out" / "fake.gguf", lambda stage, f: seen.append(f))
    assert out.read_bytes().startswith(b"alpha") and out.stat().st_size == fake_parts.size
    assert seen[-1] == 1.0


def test_corrupt_part_is_refused(fake_parts, tmp_path):
    (tmp_path / "fakepart2" / "data" / "part02.bin").write_bytes(b"beta" * 999 + b"BETA")
    with pytest.raises(ModelError, match="corrupt"):
        default_models.assemble(fake_parts, tmp_path / "out" / "fake.gguf")
    assert not (tmp_path / "out" / "fake.gguf").exists()


def test_missing_part_package_is_named(fake_parts):
    missing = default_models.PackagedGGUF("Fake", "fakepart", 4, "fake-part", "1.0", 1, "0" * 64)
    with pytest.raises(ModelError, match="fake-part4==1.0 is not installed"):
        missing.part_paths()


def test_a_full_disk_while_assembling_leaves_no_partial_file(fake_parts, tmp_path, monkeypatch):
    import builtins
    import errno
    import io

    class FullDisk(io.FileIO):
        def write(self, data):
            super().write(bytes(data[:100]))
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(default_models, "open", lambda path, mode="r": FullDisk(path, "wb") if "w" in mode
                        else builtins.open(path, mode), raising=False)
    with pytest.raises(OSError, match="No space left"):
        default_models.assemble(fake_parts, tmp_path / "out" / "fake.gguf")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_full_disk_while_preparing_a_model_says_so_and_leaves_nothing(tmp_path, monkeypatch):
    """safetensors reports a full disk as its own error, with the words only; the unfinished copy
    (a gigabyte for the default target) must not stay and keep the disk full."""
    from app.engine.models import loading as models
    from app.engine.lowbit import loader, prepared_tensors as store
    from app.engine.lowbit.modules import quantize_model

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(EMPTY_GGUF)
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "load_gguf_lowbit", lambda *_, **__: quantize_model(tiny_model(seed=1).model, 8))
    monkeypatch.setattr(models, "_gguf_tokenizer", lambda path, model_type: tiny_model(seed=1).tokenizer)

    def full_disk(tensors, path):
        Path(path).write_bytes(b"x" * 1000)
        raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(store, "save_file", full_disk)
    with pytest.raises(ModelError, match="Not enough disk space in .*SPECCHAT_CACHE"):
        load_model(str(gguf))
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_int8_draft_is_smaller_and_keeps_the_target_output(tmp_path, tiny_target):
    tiny_target.model.save_pretrained(tmp_path / "m")
    tiny_target.tokenizer.save_pretrained(tmp_path / "m")
    full = load_model(str(tmp_path / "m"), precision=Precision.FP32)
    quantized = load_model(str(tmp_path / "m"), precision=Precision.INT8)
    assert quantized.name.endswith("(int8)")
    assert quantized.memory_bytes < 0.6 * full.memory_bytes
    prompt = [4, 5, 6]
    plain = generated_ids(SpeculativeEngine(full), prompt, speculative=False, max_new_tokens=32)
    steps = list(SpeculativeEngine(full, quantized).generate(prompt, GenerationOptions(k=4, adaptive=False, max_new_tokens=32)))
    assert [t.id for s in steps for t in s.tokens] == plain
    assert steps[-1].stats.accepted > 0  # an approximate copy of the target still drafts well


def test_model_bytes_count_every_tensor_once_also_beside_empty_ones(tmp_path):
    """Loaded from safetensors, an empty tensor points where the next one's data starts; it
    must not hide that tensor (the low-bit target had read 0.63 GiB instead of 1.05)."""
    import torch
    from safetensors.torch import load_file, save_file
    from torch import nn

    from app.engine.models.cpu_linear import model_bytes

    save_file({"a": torch.ones(1000), "b": torch.empty(16, 0), "c": torch.ones(10)}, tmp_path / "t.safetensors")
    loaded = load_file(tmp_path / "t.safetensors")
    module = nn.Module()
    for name in ("b", "a", "c"):  # the empty one first, as a low-bit module's buffers can come
        module.register_buffer(name, loaded[name])
    assert model_bytes(module) == 4 * 1010
    module.register_buffer("a_view", loaded["a"][:10])  # a view of a counted storage adds nothing
    assert model_bytes(module) == 4 * 1010


def test_a_damaged_prepared_copy_is_prepared_again(tmp_path, monkeypatch):
    """A prepared (repacked) copy that cannot be read is prepared again from the GGUF, with a
    warning, instead of refusing the model until the user finds and deletes the cache."""
    from app.engine.models import loading as models
    from app.engine.lowbit import loader, prepared_tensors as store
    from app.engine.lowbit.modules import quantize_model

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(EMPTY_GGUF)  # only its name, size and time key the prepared copy here
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    tiny = tiny_model(seed=1)
    repacked = []

    def repack(path, bits, progress, feed_forward_bits=None):  # stands in for reading the GGUF only
        repacked.append(path)
        return quantize_model(tiny_model(seed=1).model, 8)

    monkeypatch.setattr(loader, "load_gguf_lowbit", repack)
    monkeypatch.setattr(models, "_gguf_tokenizer", lambda path, model_type: tiny.tokenizer)
    prompt = [1, 5, 9, 2]
    first = load_model(str(gguf))
    expected = generated_ids(SpeculativeEngine(first), prompt, speculative=False, max_new_tokens=6)
    (folder,) = (tmp_path / "cache" / "models").iterdir()
    assert store.is_complete(folder) and len(repacked) == 1
    (folder / store.WEIGHTS).write_bytes(b"not safetensors")  # a damaged copy
    with pytest.warns(UserWarning, match="could not be read"):
        again = load_model(str(gguf))
    assert len(repacked) == 2 and store.is_complete(folder)
    assert generated_ids(SpeculativeEngine(again), prompt, speculative=False, max_new_tokens=6) == expected
    load_model(str(gguf))  # and the copy prepared again is read as it is
    assert len(repacked) == 2



def test_a_turn_ends_at_the_chat_formats_end_of_turn_tokens():
    """A GGUF names one end-of-sequence token; Gemma's is <eos> while its turns end with
    <end_of_turn>: every special token that ends a turn in the common chat formats stops an answer
    (the loop stops at any stop token, tested in test_limits), other special tokens do not."""
    model = tiny_model(seed=3)
    before = model.stop_tokens
    model.tokenizer.add_special_tokens({"additional_special_tokens": ["<end_of_turn>", "<start_of_turn>", "<|eot_id|>"]})
    end, start, eot = model.tokenizer.convert_tokens_to_ids(["<end_of_turn>", "<start_of_turn>", "<|eot_id|>"])
    assert model.stop_tokens == before | {end, eot}


def test_stored_tensors_are_read_whole_into_one_buffer_or_refused(tmp_path):
    """A stored model's tensors read straight into one (huge-page) buffer: the same values, dtypes
    and shapes as safetensors reads, empty tensors included; a cut or foreign file is refused with
    ValueError (the caller then prepares the model again)."""
    import torch
    from safetensors.torch import load_file, save_file

    from app.engine.lowbit.memory import read_in_huge_pages

    tensors = {"q": torch.randint(0, 255, (3, 70), dtype=torch.uint8), "empty": torch.empty(16, 0, dtype=torch.float16),
               "scale": torch.randn(5, 7).half(), "codes": torch.randint(-9, 9, (33,), dtype=torch.int8),
               "norm": torch.randn(9), "ids": torch.arange(4)}
    save_file(tensors, tmp_path / "t.safetensors", metadata={"format": "pt"})
    read, expected = read_in_huge_pages(tmp_path / "t.safetensors"), load_file(tmp_path / "t.safetensors")
    assert read.keys() == expected.keys()
    for name, tensor in expected.items():
        assert read[name].dtype == tensor.dtype and torch.equal(read[name], tensor), name
    assert len({t.untyped_storage().data_ptr() for t in read.values()}) == 1  # one buffer
    whole = (tmp_path / "t.safetensors").read_bytes()
    for damaged in (whole[:-10], whole[:5], b"\xff" * 8 + whole[8:], whole[:8] + b"{not json" + whole[17:]):
        (tmp_path / "d.safetensors").write_bytes(damaged)
        with pytest.raises(ValueError):
            read_in_huge_pages(tmp_path / "d.safetensors")


def test_a_model_too_large_for_this_machine_is_refused_before_it_loads(tmp_path, monkeypatch):
    """A GGUF that cannot fit the machine's memory even with nothing else running (a 32B on a
    16 GB laptop) is refused with the sizes named, before a byte of it is read; so is a folder
    whose float32 weights cannot; the same folder loads where it fits."""
    from app.engine import memory_check

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(memory_check, "total_memory", lambda: 16 * 2**30)
    huge = tmp_path / "qwen2.5-32b-q4_k_m.gguf"
    with open(huge, "wb") as handle:
        handle.write(EMPTY_GGUF)
        handle.truncate(19 * 2**30)  # sparse: its size, no data
    with pytest.raises(ModelError, match=r"needs about 25\.6 GiB of memory while its first start repacks it, "
                                         r"and this machine has 16\.0 GiB in all"):
        load_model(str(huge))
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())

    folder = tmp_path / "tiny"
    tiny = tiny_model(seed=1)
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    weights = sum(p.numel() for p in tiny.model.state_dict().values() if p is not None)
    monkeypatch.setattr(memory_check, "total_memory", lambda: int(memory_check.RESERVE) + 4 * weights - 1)
    with pytest.raises(ModelError, match="as float32, and this machine has .* Pick a smaller model, or the low-bit"):
        load_model(str(folder), precision="fp32")
    monkeypatch.setattr(memory_check, "total_memory", lambda: int(memory_check.RESERVE) + 4 * weights)
    assert load_model(str(folder), precision="fp32").precision == "fp32"


def test_a_model_that_fits_alone_but_not_beside_the_other_is_refused(tmp_path, monkeypatch):
    """An 8 GiB file's first start needs 10.8 GiB: it fits a 16 GB machine alone, not beside a
    5 GiB model already loaded (the pair's other one)."""
    from app.engine import memory_check

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(memory_check, "total_memory", lambda: 16 * 2**30)
    big = tmp_path / "big.gguf"
    with open(big, "wb") as handle:
        handle.write(EMPTY_GGUF)
        handle.truncate(8 * 2**30)
    with pytest.raises(ModelError, match=r"needs about 10\.8 GiB .* beside the 5\.0 GiB the other model takes, and"):
        load_model(str(big), held=5 * 2**30)
    with pytest.raises(ModelError, match="Cannot read GGUF file"):  # alone, it passes the check and is read
        load_model(str(big))


def test_a_7b_model_folder_fits_a_16_gb_machine_at_low_bit_but_not_as_float32(tmp_path, monkeypatch):
    """A folder at low bit is quantized a few rows at a time: it needs about its low-bit size, not
    its float32 size. A Qwen2.5 7B folder (7.6 billion weights) on a 16 GB machine: 9.6 GiB on its
    first start and 8.0 later at 8 bits, where float32 needs 28.4."""
    import json
    import struct

    from app.engine import memory_check

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(memory_check, "total_memory", lambda: 16 * 2**30)
    folder = tmp_path / "Qwen2.5-7B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    shapes = {"model.embed_tokens.weight": [152064, 3584], **{f"model.layers.{i}.weight": [1000, 505000] for i in range(14)}}
    header = json.dumps({name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in shapes.items()})
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())  # headers only
    need, why = memory_check.needed_bytes(folder, None, Precision.LOWBIT, prepared=False)
    assert round(need / 2**30, 1) == 9.6 and why == "while its first start quantizes it to 8 bits"
    assert round(memory_check.needed_bytes(folder, None, Precision.LOWBIT, prepared=True)[0] / 2**30, 1) == 8.0
    assert round(memory_check.needed_bytes(folder, None, Precision.BITS4, prepared=True)[0] / 2**30, 1) == 4.4
    with pytest.raises(ModelError) as refused:
        load_model(str(folder))  # passes the check; the empty weights then fail to read
    assert "memory" not in str(refused.value)
    with pytest.raises(ModelError, match=r"needs about 28\.4 GiB of memory to read its 7\.6 billion weights as float32"):
        load_model(str(folder), precision="fp32")
    monkeypatch.setattr(memory_check, "total_memory", lambda: 10 * 2**30)
    with pytest.raises(ModelError, match=r"needs about 9\.6 GiB of memory while its first start quantizes it to 8 bits"):
        load_model(str(folder))


def test_prepared_copies_are_listed_and_a_changed_files_old_copy_is_dropped(tmp_path, monkeypatch):
    """Every low-bit start notes the copy's source and use; a GGUF replaced under the same name (a
    new download: another size or time) gets a new copy and the old one, which nothing could load
    again, goes. Copies of another file, or of the same file at another precision, stay."""
    import os

    from app.engine.models import loading as models, prepared_copies as prepared
    from app.engine.lowbit import loader, prepared_tensors as store
    from app.engine.lowbit.modules import quantize_model

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "load_gguf_lowbit", lambda *_, **__: quantize_model(tiny_model(seed=1).model, 8))
    monkeypatch.setattr(models, "_gguf_tokenizer", lambda path, model_type: tiny_model(seed=1).tokenizer)
    gguf, other = tmp_path / "model.gguf", tmp_path / "other.gguf"
    for path in (gguf, other):
        path.write_bytes(EMPTY_GGUF)  # only name, size and time key a copy here
    load_model(str(gguf))
    load_model(str(other))
    load_model(str(gguf), precision=Precision.BITS4)
    (first, *_) = [c for c in prepared.copies() if c.source == str(gguf) and c.precision == "lowbit"]
    assert store.is_complete(first.path) and first.size > 0 and not first.source_missing
    assert prepared.age_in_words(first.last_used) == "today"

    os.utime(gguf, (1e9, 1e9))  # the file changed
    load_model(str(gguf))
    listed = {(c.source, c.precision): c for c in prepared.copies()}
    assert len(listed) == len(prepared.copies()) == 3  # not four: the old lowbit copy went
    assert not first.path.exists() and listed[str(gguf), "lowbit"].path != first.path
    assert prepared.copies()[0] == listed[str(gguf), "lowbit"]  # the most recently used first

    other.unlink()  # a copy whose file is gone is shown so, and can be deleted
    gone = listed[str(other), "lowbit"]
    assert [c.source_missing for c in prepared.copies() if c.path == gone.path] == [True]
    prepared.delete(gone)
    assert not gone.path.exists() and len(prepared.copies()) == 2


def test_age_in_words():
    import time

    from app.engine.models.prepared_copies import age_in_words

    noon = time.mktime((2001, 9, 9, 12, 0, 0, 0, 0, -1))  # local time
    assert [age_in_words(noon - hours * 3600, noon) for hours in (11, 13, 24, 120)] == \
        ["today", "yesterday", "yesterday", "5 days ago"]
    assert age_in_words(noon - 40 * 86400, noon) == "2001-07-31"


def test_copies_prepared_before_they_noted_their_source_are_known_by_their_names(tmp_path, monkeypatch):
    from app.engine.models import prepared_copies as prepared

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    for name in ("Qwen2.5-Coder-0.5B-Instruct-3bit", "Qwen2.5-Coder-1.5B-Instruct", "mine-0123456789abcdef-4bit",
                 "mine-0123456789abcdef-lowbit.partial"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    assert sorted((c.path.name, c.source, c.precision) for c in prepared.copies()) == [
        ("Qwen2.5-Coder-0.5B-Instruct-3bit", "default-draft", "3bit"),
        ("Qwen2.5-Coder-1.5B-Instruct", "default-target", "fp32"),
        ("mine-0123456789abcdef-4bit", None, "4bit")]


def test_an_assembled_file_of_the_right_size_is_checked_before_it_is_used_again(fake_parts, tmp_path):
    out = default_models.assemble(fake_parts, tmp_path / "out" / "fake.gguf")
    damaged = bytearray(out.read_bytes())
    damaged[100] ^= 0xFF  # same size, one bad byte (a cut write the disk never flushed, a bad block)
    out.write_bytes(bytes(damaged))
    assert default_models.assemble(fake_parts, out).read_bytes() == b"alpha" * 1000 + b"beta" * 1000 + b"gamma" * 1000


CUSTOM_CODE = '''
from pathlib import Path
Path(__file__).with_name("ran").write_text("the folder's own code ran")
from transformers import PretrainedConfig
class CustomConfig(PretrainedConfig):
    model_type = "specchat-custom"
'''


def test_a_model_folders_own_code_never_runs_even_when_a_user_would_say_yes(tmp_path):
    """transformers asks on standard input before it runs a folder's code (auto_map); the app
    refuses such folders without asking, so no answer typed, or piped, can let it run."""
    import json
    import subprocess

    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "specchat-custom", "auto_map": {
        "AutoConfig": "configuration_custom.CustomConfig", "AutoModelForCausalLM": "configuration_custom.CustomConfig",
        "AutoTokenizer": ["configuration_custom.CustomConfig", None]}}))
    (folder / "configuration_custom.py").write_text(CUSTOM_CODE)
    script = ("import sys\nfrom app.engine.errors import ModelError\nfrom app.engine.models.loading import load_model, load_tokenizer\n"
              "for load in (load_tokenizer, load_model, lambda f: load_model(f, precision='fp32')):\n"
              "    try:\n        load(sys.argv[1])\n    except ModelError as error:\n        print('refused')\n")
    run = subprocess.run([sys.executable, "-c", script, str(folder)], input="y\n" * 10, capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parents[1],
                         env={**__import__("os").environ, "SPECCHAT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"})
    assert not (folder / "ran").exists(), run.stdout + run.stderr
    assert run.stdout.split() == ["refused"] * 3, run.stdout + run.stderr[-2000:]


def test_a_gpus_float_copy_of_a_gguf_is_labelled_fp32_and_keeps_the_cpus_low_bit_copy(tmp_path, monkeypatch):
    """On a GPU (here the meta device: any but the CPU) a GGUF loads from its float32 copy whatever
    CPU precision the pickers show; that copy must say fp32, or noting it deletes the CPU's
    low-bit copy of the same file (and the next CPU start the float one)."""
    from app.engine.models import loading as models, prepared_copies
    from app.engine.lowbit import loader
    from app.engine.lowbit.modules import quantize_model

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(EMPTY_GGUF)  # only its name, size and time key the prepared copies here
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    tiny = tiny_model(seed=1)

    def dequantized(path, folder, name, report):  # stands in for transformers' reading of the GGUF
        tiny.model.save_pretrained(folder)
        tiny.tokenizer.save_pretrained(folder)
        return folder

    monkeypatch.setattr(loader, "load_gguf_lowbit", lambda *args, **kwargs: quantize_model(tiny_model(seed=1).model, 8))
    monkeypatch.setattr(models, "_gguf_tokenizer", lambda path, model_type: tiny.tokenizer)
    monkeypatch.setattr(models, "_dequantized", dequantized)
    load_model(str(gguf))  # the CPU's low-bit copy
    on_gpu = load_model(str(gguf), "meta", torch.bfloat16, precision="lowbit")
    assert on_gpu.precision == "bfloat16"
    labels = sorted((copy.precision, copy.path.name.startswith("model")) for copy in prepared_copies.copies())
    assert labels == [("fp32", True), ("lowbit", True)], labels
