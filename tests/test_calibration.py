"""Costs remembered between starts: timed once per models, precision and hardware (a GPU by its
name; on the CPU the kernel build, threads and processor)."""
import pytest

from app.engine.models import decoder
from app.engine.calibration import calibrate_remembered
from app.engine.engine import SpeculativeEngine
from app.engine.lowbit import kernel
from app.engine.models.loading import LoadedModel
from tests.tiny import tiny_model


def test_a_second_start_uses_the_remembered_costs(tiny_draft, tmp_path, monkeypatch):
    path = tmp_path / "costs.json"
    tiny_target = tiny_model(seed=1, context=1024)  # long enough for passes timed after 512 tokens too
    first = SpeculativeEngine(tiny_target, tiny_draft)
    assert calibrate_remembered(first, path) is False and first.costs.ready and first.costs.verify_at
    monkeypatch.setattr(decoder, "pass_seconds", _no_timing)
    monkeypatch.setattr("app.engine.engine.pass_seconds", _no_timing)
    second = SpeculativeEngine(tiny_target, tiny_draft)
    assert calibrate_remembered(second, path) is True
    assert second.costs.verify == first.costs.verify and second.costs.verify_at == first.costs.verify_at
    assert (second.costs.draft_token, second.costs.catch_up_token) == (first.costs.draft_token, first.costs.catch_up_token)


def test_other_models_or_a_damaged_file_are_timed_again(tiny_target, tiny_draft, tmp_path):
    path = tmp_path / "costs.json"
    calibrate_remembered(SpeculativeEngine(tiny_target, tiny_draft), path)
    other = LoadedModel("tiny-1", tiny_target.model, tiny_target.tokenizer, precision="4bit")
    assert calibrate_remembered(SpeculativeEngine(other, tiny_draft), path) is False
    path.write_text("{not json")
    engine = SpeculativeEngine(tiny_target, tiny_draft)
    assert calibrate_remembered(engine, path) is False and engine.costs.ready
    assert calibrate_remembered(SpeculativeEngine(tiny_target, tiny_draft), path) is True  # rewritten


def test_another_kernel_build_is_timed_again(tiny_target, tiny_draft, tmp_path, monkeypatch):
    path = tmp_path / "costs.json"
    calibrate_remembered(SpeculativeEngine(tiny_target, tiny_draft), path)
    monkeypatch.setattr(kernel, "build_id", lambda: "another build")
    assert calibrate_remembered(SpeculativeEngine(tiny_target, tiny_draft), path) is False


def test_a_gpu_is_keyed_by_its_name_and_never_builds_the_cpu_kernel(monkeypatch):
    """The key as a CUDA machine makes it (the GPU's name injected where torch is asked for it)."""
    import torch

    from app.engine.calibration import hardware

    monkeypatch.setattr(kernel, "build_id", lambda: pytest.fail("the CPU kernel was built for a GPU's costs"))
    names = {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA GeForce RTX 4090"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: names[device.index])
    first, second = hardware(torch.device("cuda", 0)), hardware(torch.device("cuda", 1))
    assert first == "cuda:0 NVIDIA H100 80GB HBM3" and second == "cuda:1 NVIDIA GeForce RTX 4090"
    assert hardware(torch.device("mps")) == "mps"


def _no_timing(*args, **kwargs):
    pytest.fail("the models were timed although their costs were remembered")
