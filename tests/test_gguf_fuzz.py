"""Malformed GGUF files given as a model: a small file cut at every byte of its header and tensor
table, bytes of its header flipped at random, huge counts, shapes that disagree with the config.
Each must end in a clear ModelError (or, where a flip left a valid file, a load), in one child
process whose address space is limited to 8 GiB, each file within a minute."""
import json
import os
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from app.engine.lowbit import gguf_check
from tests.test_lowbit import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[1]
ADDRESS_SPACE = 8 << 30
PER_FILE_S = 60

# Loads each file as the app does (models.load_model at low bit) and prints one JSON line per file.
# The files have no tokenizer, so none loads whole: a file whose weights load is then run through
# the kernel too (its low-bit weights, one pass), where a shape that slipped through would be read
# out of bounds (test_sanitizers runs this under AddressSanitizer).
LOADER = textwrap.dedent("""
    import json, os, resource, signal, sys
    from pathlib import Path
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):  # the sanitizer maps terabytes of shadow memory
        resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
    import torch
    from app.engine.models.decoder import cached
    from app.engine.errors import ModelError
    from app.engine.lowbit.loader import load_gguf_lowbit
    from app.engine.models.loading import load_model

    def too_long(*_):
        raise TimeoutError("over the time allowed")

    signal.signal(signal.SIGALRM, too_long)
    for path in sys.argv[3:]:
        signal.alarm(int(sys.argv[2]))
        try:
            load_model(path, precision="lowbit")
            outcome = {"loaded": True}
        except ModelError as error:
            outcome = {"refused": str(error)}
        except BaseException as error:
            outcome = {"other": f"{type(error).__name__}: {error}"}
        if "refused" in outcome and "not a readable GGUF file" not in outcome["refused"]:
            try:
                model = load_gguf_lowbit(Path(path))  # what load_model did before it looked for the tokenizer
            except Exception:  # refused by the loader: load_model said so above
                model = None
            if model is not None:
                try:
                    cached(model).forward(torch.arange(8) % model.config.vocab_size, keep=1)
                    outcome["ran"] = True
                except RuntimeError as error:  # a kernel's check refused a shape
                    outcome["ran"] = str(error).splitlines()[0]
        signal.alarm(0)
        print(json.dumps({"path": path, **outcome}), flush=True)
""")


def load_each(paths: list[Path]) -> list[dict]:
    # the user's cache: its kernel build is there (no file here loads whole, so no copy is left)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", LOADER, str(ADDRESS_SPACE), str(PER_FILE_S), *map(str, paths)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=PER_FILE_S * len(paths) + 300)
    outcomes = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(outcomes) == len(paths), f"the loader ended early (code {run.returncode}): {run.stderr[-3000:]}"
    return outcomes


def assert_clear(outcomes: list[dict]) -> None:
    bad = [o for o in outcomes if "other" in o]
    assert not bad, f"{len(bad)} files ended otherwise than in a ModelError, the first: {bad[0]}"
    for outcome in outcomes:
        if "refused" in outcome:
            assert "\n" not in outcome["refused"] and len(outcome["refused"]) < 600, outcome


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "good.gguf"
    write_tiny_gguf(path, "qwen2", layers=1)
    return path


def table_end(path: Path) -> int:
    """Where the header, fields and tensor descriptions end (the tensor data starts after them)."""
    from app.engine.lowbit import gguf_file

    reader = gguf_file.parse(path)
    return min(int(tensor.data_offset) for tensor in reader.tensors)


def test_a_file_cut_anywhere_in_its_header_and_table_is_refused(good, tmp_path):
    data, end = good.read_bytes(), table_end(good)
    for cut in range(end + 1):
        with pytest.raises(Exception) as refused:
            gguf_check.check(_written(tmp_path / "cut.gguf", data[:cut]))
        assert refused.type.__name__ == "ModelError" and "\n" not in str(refused.value), (cut, refused.value)
    # the app's whole load path, on a sample of the cuts (a process per file would take minutes)
    cuts = sorted(random.Random(1).sample(range(end), 40)) + [end, len(data) - 1]
    paths = [_written(tmp_path / f"cut{cut}.gguf", data[:cut]) for cut in cuts]
    outcomes = load_each(paths)
    assert_clear(outcomes)
    assert all("refused" in o for o in outcomes)


def test_bytes_flipped_in_the_header_end_in_a_clear_error_or_a_load(good, tmp_path):
    data, end = good.read_bytes(), table_end(good)
    rng = random.Random(2)
    paths = []
    for index in range(30):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(end)] ^= 1 << rng.randrange(8)
        paths.append(_written(tmp_path / f"flip{index}.gguf", bytes(flipped)))
    outcomes = load_each(paths + [good])
    assert_clear(outcomes)
    assert outcomes[-1].get("ran") is True  # the unflipped file's weights run through the kernel


def huge_count_file(path: Path) -> Path:
    """The 61-byte file: one field, an array that claims 2^40 items."""
    key = b"general.items"
    field = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 4, 1 << 40)  # an array of 2^40 uint32
    return _written(path, b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + field)


def test_huge_counts_and_offsets_are_refused(good, tmp_path):
    data = good.read_bytes()
    tensors_at = 8  # the tensor count follows the signature and the version
    files = [
        huge_count_file(tmp_path / "huge_array.gguf"),
        _written(tmp_path / "many_tensors.gguf", data[:tensors_at] + struct.pack("<Q", 1 << 62) + data[tensors_at + 8:]),
        _written(tmp_path / "many_fields.gguf", data[:16] + struct.pack("<Q", 1 << 62) + data[24:]),
        _written(tmp_path / "short_data.gguf", data[: len(data) - 64]),  # the last tensor's bytes run past the end
    ]
    assert len(files[0].read_bytes()) == 61
    outcomes = load_each(files)
    assert_clear(outcomes)
    assert all("refused" in o and "not a readable GGUF file" in o["refused"] for o in outcomes), outcomes


def test_a_tensor_shaped_otherwise_than_the_config_is_refused(tmp_path):
    """A short output norm (the C++ norm would have read past it on every token), and a layer's
    weight with rows the config does not have."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from app.engine.lowbit import gguf_writing

    rng = np.random.default_rng(0)
    shape = gguf_writing.Shape(1, 64, 128, 4, 2, 16, 96, rope_base=10000.0, context=256)
    short_norm = lambda n: np.ones(n - 1 if n == 64 else n, dtype=np.float32)
    norm = lambda n: np.ones(n, dtype=np.float32)

    def weight(grown: str):
        def make(name, size):
            rows = size[0] + 32 if name == grown else size[0]
            return quantize(rng.standard_normal((rows, size[1])).astype(np.float32), GGMLQuantizationType.Q8_0), \
                GGMLQuantizationType.Q8_0
        return make

    short = tmp_path / "short_norm.gguf"
    gguf_writing.write(short, "qwen2", shape, weight(""), short_norm, tied=False)
    wide = tmp_path / "wide_ffn.gguf"
    gguf_writing.write(wide, "qwen2", shape, weight("blk.0.ffn_up.weight"), norm, tied=False)
    outcomes = load_each([short, wide])
    assert_clear(outcomes)
    assert all("refused" in o and "but the model its config describes needs" in o["refused"] for o in outcomes), outcomes


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
