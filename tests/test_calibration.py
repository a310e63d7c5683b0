"""Costs remembered between starts: timed once per models, precision, kernel build, threads and CPU."""
import pytest

from app.engine.models import decoder
from app.engine.calibration import calibrate_remembered
from app.engine.engine import SpeculativeEngine
from app.engine.lowbit import kernel
from app.engine.models.loading import LoadedModel


def test_a_second_start_uses_the_remembered_costs(tiny_target, tiny_draft, tmp_path, monkeypatch):
    path = tmp_path / "costs.json"
    first = SpeculativeEngine(tiny_target, tiny_draft)
    assert calibrate_remembered(first, path) is False and first.costs.ready
    monkeypatch.setattr(decoder, "pass_seconds", _no_timing)
    monkeypatch.setattr("app.engine.engine.pass_seconds", _no_timing)
    second = SpeculativeEngine(tiny_target, tiny_draft)
    assert calibrate_remembered(second, path) is True
    assert second.costs.verify == first.costs.verify
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


def _no_timing(*args, **kwargs):
    pytest.fail("the models were timed although their costs were remembered")
