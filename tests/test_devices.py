"""The device and its memory, with what torch would say of a GPU injected where it is asked: the
device picked and its dtype, the memory a GPU load needs checked before it starts, an
out-of-memory error said in words, and a model switch that releases the old pair first."""
import weakref

import pytest
import torch

from app.engine import devices, memory_check
from app.engine.choices import LoadOptions, Precision
from app.engine.errors import ModelError
from app.engine.model_pool import ModelPool
from app.engine.models import loading
from app.engine.models.loading import load_model
from tests.tiny import tiny_model

GiB = 2**30


def test_a_cuda_card_without_bfloat16_runs_in_float16(monkeypatch):
    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    device, dtype, said = devices.pick_device()
    assert (device.type, dtype) == ("cuda", torch.float16) and said == "CUDA: Tesla T4 (float16: this card has no bfloat16)"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    assert devices.pick_device()[1:] == (torch.bfloat16, "CUDA: NVIDIA H100 80GB HBM3 (bfloat16)")


def test_an_apple_gpu_runs_in_float16_and_the_cpu_can_be_chosen_instead(monkeypatch):
    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    device, dtype, said = devices.pick_device()
    assert (device.type, dtype, said) == ("mps", torch.float16, "Apple GPU (MPS, float16)")
    monkeypatch.setenv("SPECCHAT_DEVICE", "cpu")
    assert devices.pick_device() == (torch.device("cpu"), torch.float32, "CPU: chosen by SPECCHAT_DEVICE")
    monkeypatch.setenv("SPECCHAT_DEVICE", "cuda")  # asked for, not there: the CPU, and why
    assert devices.pick_device()[2] == "CPU: SPECCHAT_DEVICE asks for cuda, which torch does not see"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.delenv("SPECCHAT_DEVICE")
    assert devices.pick_device()[2] == "CPU: no CUDA or Apple GPU visible to torch"


@pytest.fixture
def a_gpu(monkeypatch, tmp_path):
    """A 'cuda' device whose free memory, the disk's free space and the machine's memory are
    what the test sets; a model folder of a tiny model to load."""
    room = {"gpu": (8 * GiB, 16 * GiB), "disk": 100 * GiB, "memory": 64 * GiB}
    monkeypatch.setattr(devices, "free_memory", lambda device: room["gpu"])
    monkeypatch.setattr(devices, "device_name", lambda device: "NVIDIA GeForce RTX 4060")
    monkeypatch.setattr(memory_check, "disk_free", lambda folder: room["disk"])
    monkeypatch.setattr(memory_check, "total_memory", lambda: room["memory"])
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    return room


def test_a_gpu_load_is_refused_before_it_starts_when_the_gpus_memory_cannot_hold_it(a_gpu):
    """7 billion weights in bfloat16 on a card with 8 GiB free: refused with the sizes, before
    anything is read or written."""
    with pytest.raises(ModelError) as refused:
        memory_check.check_float_load("Qwen2.5-7B", 7_000_000_000, 0, 2, torch.device("cuda"), memory_check.Path("/x"))
    assert str(refused.value).startswith(
        "Qwen2.5-7B needs about 13.5 GiB of GPU memory (7.0 billion weights at 2 bytes, and room to run), and "
        "NVIDIA GeForce RTX 4060 has 8.0 GiB free of 16.0 GiB.")
    memory_check.check_float_load("Qwen2.5-3B", 3_000_000_000, 0, 2, torch.device("cuda"), memory_check.Path("/x"))


def test_a_gguf_first_gpu_start_checks_the_disk_and_memory_its_float32_copy_takes(a_gpu):
    """The default target on a GPU for the first time: its float32 copy (4 bytes per weight) and
    the assembled file beside it must fit the disk, and reading it as float32 the memory."""
    target = loading.default_models.TARGET
    weights, written = loading._float_copy_needs("default-target", target)
    assert (weights, written) == (target.weights, 4 * target.weights + target.size)  # 8.2 GB
    a_gpu["disk"] = 5 * GiB
    with pytest.raises(ModelError, match=r"its float32 copy takes about 7\.7 GiB and 5\.0 GiB are free"):
        load_model("default-target", "cuda", torch.bfloat16)
    a_gpu["disk"], a_gpu["memory"] = 100 * GiB, 8 * GiB
    with pytest.raises(ModelError, match=r"needs about 6\.6 GiB of this machine's memory to read its 1\.8 billion "
                                         r"weights as float32, and it has 8\.0 GiB in all"):
        load_model("default-target", "cuda", torch.bfloat16)
    a_gpu["memory"], a_gpu["gpu"] = 64 * GiB, (2 * GiB, 4 * GiB)
    with pytest.raises(ModelError, match=r"needs about 3\.8 GiB of GPU memory .* has 2\.0 GiB free of 4\.0 GiB"):
        load_model("default-target", "cuda", torch.bfloat16)


def test_an_out_of_memory_error_while_moving_to_the_gpu_is_said_in_words(a_gpu, tmp_path, monkeypatch):
    """torch's error injected where the model moves (Module.to), as a card already busy raises it."""
    tiny = tiny_model(seed=1)
    tiny.model.save_pretrained(tmp_path / "tiny")
    tiny.tokenizer.save_pretrained(tmp_path / "tiny")
    moved = []

    def to(module, *args, **kwargs):
        moved.append(weakref.ref(module))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
                                     "of 7.63 GiB of which 3.06 MiB is free.")

    monkeypatch.setattr(torch.nn.Module, "to", to)
    freed_when_released = []  # the GPU's cached blocks go back once the half-moved model is gone
    monkeypatch.setattr(devices, "release_cached", lambda device: freed_when_released.append(moved[0]() is None))
    with pytest.raises(ModelError) as refused:
        load_model(str(tmp_path / "tiny"), "cuda", torch.bfloat16)
    assert str(refused.value).startswith("tiny does not fit in the memory of NVIDIA GeForce RTX 4060: CUDA out of "
                                         "memory. Tried to allocate 20.00 MiB.")
    assert "SPECCHAT_DEVICE=cpu" in str(refused.value)
    assert freed_when_released == [True]


def test_on_a_gpu_the_old_pair_goes_before_the_new_one_loads_and_precisions_reload_nothing(monkeypatch):
    """A GPU runs one float model whatever the precision pickers say: changing them loads nothing.
    Choosing another target frees the old one (and the GPU's cached blocks) before the new loads."""
    from app.engine import calibration

    monkeypatch.setattr(devices, "pick_device", lambda chosen="auto": (torch.device("cuda"), torch.bfloat16, "CUDA: test"))
    released, loads, alive = [], [], {}
    monkeypatch.setattr(devices, "release_cached", lambda device: released.append(device.type))
    monkeypatch.setattr(calibration, "calibrate_remembered", lambda engine: True)

    def load(source, device, dtype, report, precision, held):
        loads.append((source, [name for name, ref in alive.items() if ref() is not None]))
        model = tiny_model(seed=len(loads))
        alive[source] = weakref.ref(model.model)
        return model

    pool = ModelPool(load)
    engine = pool.engine(pool.request(), LoadOptions(), lambda *_: None)
    assert [source for source, _ in loads] == ["default-target", "default-draft"]
    engine = pool.engine(pool.request(), LoadOptions(precision=Precision.FP32, draft_precision=Precision.INT8),
                         lambda *_: None)
    assert len(loads) == 2  # nothing reloaded
    del engine  # as the window lets go of the engine it replaces
    pool.engine(pool.request(), LoadOptions(target="other-target"), lambda *_: None)
    assert loads[-1] == ("other-target", ["default-draft"])  # the old target was gone before
    assert released == ["cuda"]


def test_a_prompt_whose_caches_outgrow_the_gpus_free_memory_is_refused(a_gpu):
    """On a GPU the caches live in its memory: 100,000 tokens at 1 MiB each against 8 GiB free."""
    from app.engine.errors import PromptTooLongError

    with pytest.raises(PromptTooLongError, match=r"need about 97\.9 GiB of memory .* and 8\.0 GiB are free now"):
        memory_check.check_caches_fit(100_000, 2**20, torch.device("cuda"))
    memory_check.check_caches_fit(4_000, 2**20, torch.device("cuda"))


def test_the_apple_gpus_cpu_fallback_is_switched_on_before_torch_is_imported():
    """torch reads PYTORCH_ENABLE_MPS_FALLBACK when it is imported: set any later, it does nothing."""
    import os
    import subprocess
    import sys

    script = ("import os, sys\n"
              "class Watch:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'torch':\n"
              "            print(os.environ.get('PYTORCH_ENABLE_MPS_FALLBACK'))\n"
              "            sys.meta_path.remove(self)\n"
              "sys.meta_path.insert(0, Watch())\n"
              "import app.engine.devices\n")
    env = {key: value for key, value in os.environ.items() if key != "PYTORCH_ENABLE_MPS_FALLBACK"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert run.stdout.split() == ["1"], run.stdout + run.stderr[-2000:]
